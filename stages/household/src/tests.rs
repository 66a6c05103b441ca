//! Unit tests across the modules: expert plans, shortness, invalid steps,
//! splits, rows, reseeding.

use std::collections::HashMap;

use proptest::prelude::*;

use crate::task::{
    FAMILIES, HELD_OUT_FAMILY, bfs_shortest_len, candidate_goals, goal_pair, held_out_pair,
};
use crate::world::Receptacle;
use crate::*;

fn mixed_tasks(per_split: usize) -> Vec<Task> {
    let mut tasks = Vec::new();
    for split in [Split::Train, Split::Val, Split::Unseen] {
        tasks.extend(generate_tasks(split, 3, per_split));
    }
    tasks
}

#[test]
fn expert_plans_succeed_for_every_type_and_split() {
    let mut by_type: HashMap<(Split, TaskType), usize> = HashMap::new();
    for task in mixed_tasks(400) {
        let plan = expert_plan(&task);
        assert!(!plan.is_empty(), "{}", task.task_id);
        let run = execute_ids(&task, &plan);
        assert!(run.success, "{} {:?}", task.task_id, task);
        assert!(run.step_valid.iter().all(|&v| v), "{}", task.task_id);
        assert_eq!(run.env_steps, plan.len());
        *by_type.entry((task.split, task.task_type)).or_default() += 1;
    }
    for split in [Split::Train, Split::Val, Split::Unseen] {
        for ty in TaskType::ALL {
            let n = by_type.get(&(split, ty)).copied().unwrap_or(0);
            assert!(n >= 20, "{split} {ty}: only {n} tasks");
        }
    }
}

#[test]
fn expert_plans_are_shortest() {
    // Breadth-first search over the whole action list must not find a
    // shorter plan than the expert's.
    let mut by_type: HashMap<TaskType, usize> = HashMap::new();
    for task in mixed_tasks(70).into_iter().take(210) {
        let plan = expert_plan(&task);
        let shortest = bfs_shortest_len(&task, plan.len()).expect("the expert plan exists");
        assert_eq!(shortest, plan.len(), "{} {:?}", task.task_id, task);
        *by_type.entry(task.task_type).or_default() += 1;
    }
    assert_eq!(by_type.len(), 7, "{by_type:?}");
}

#[test]
fn generation_is_deterministic_and_ids_are_stable() {
    let a = generate_tasks(Split::Val, 9, 20);
    let b = generate_tasks(Split::Val, 9, 20);
    assert_eq!(a, b);
    assert_eq!(a[3].task_id, "household/val/9/000003");
    let c = generate_tasks(Split::Train, 9, 20);
    assert_ne!(a[0].seed, c[0].seed);
    for t in &a {
        assert!((4..=8).contains(&t.scene.objects.len()), "{t:?}");
        assert!((6..=10).contains(&t.scene.receptacles.len()), "{t:?}");
    }
}

fn step(id: Option<i64>, name: Option<&str>) -> PlanStep {
    PlanStep {
        action_id: id,
        action_name: name.map(str::to_string),
    }
}

fn id(name: &str) -> i32 {
    action_id(name).unwrap_or_else(|| panic!("{name}"))
}

/// A hand-written scene: an apple in the closed fridge, a knife and a mug on
/// the counter.
fn kitchen() -> Task {
    let row = TaskRow {
        task_id: "household/train/0/000000".into(),
        suite: "household".into(),
        env: "household".into(),
        split: "train".into(),
        task_type: Some("pick_and_place".into()),
        seed: 0,
        instruction: "Put an apple on the counter.".into(),
        observation: Some(
            br#"{"split":"train","task_type":"pick_and_place","family":0,
                "goal":{"object":"Apple","receptacle":"CounterTop","container":null},
                "scene":{"run":0,
                  "receptacles":[{"receptacle":"Fridge","open":false},{"receptacle":"CounterTop","open":false},
                                 {"receptacle":"SinkBasin","open":false},{"receptacle":"Microwave","open":true}],
                  "objects":[{"object":"Apple","on":"Fridge"},{"object":"Knife","on":"CounterTop"},
                             {"object":"Mug","on":"CounterTop"}]}}"#
                .to_vec(),
        ),
        gt_actions: None,
    };
    task_from_row(&row).expect("valid hand-written row")
}

use embodyflow_schemas::TaskRow;

#[test]
fn hand_written_scene_plans_and_invalid_steps() {
    let task = kitchen();
    let plan = expert_plan(&task);
    let names: Vec<&str> = plan
        .iter()
        .map(|&i| action_list()[i as usize].name.as_str())
        .collect();
    assert_eq!(
        names,
        [
            "find a Apple",
            "open the Fridge",
            "pick up the Apple",
            "find a CounterTop",
            "put down the object in hand"
        ]
    );
    // Unknown ids, out of range, name-only unknown: invalid, no panic.
    let run = execute(
        &task,
        &[
            step(Some(-5), None),
            step(Some(10_000), None),
            step(Some(i64::MAX), Some("find a Apple")),
            step(None, Some("fly to the moon")),
            step(None, None),
            step(None, Some("FIND A APPLE")),
        ],
    );
    assert_eq!(run.step_valid, [false, false, false, false, false, true]);
    assert!(!run.success);
    // Put without holding; pick up from the closed fridge; slice without knife.
    let run = execute_ids(
        &task,
        &[
            id("put down the object in hand"),
            id("find a Apple"),
            id("pick up the Apple"),
            id("slice the Apple"),
            id("find a Fridge"),
            id("open the Fridge"),
            id("open the Fridge"),
            id("pick up the Apple"),
            id("pick up the Knife"),
            id("find a Knife"),
            id("pick up the Knife"),
            id("find a CounterTop"),
            id("put down the object in hand"),
            id("find a Microwave"),
            id("turn on the Faucet"),
        ],
    );
    assert_eq!(
        run.step_valid,
        [
            false, true, false, false, true, true, false, true, false, true, false, true, true,
            true, false
        ]
    );
    assert!(run.success, "the apple ends on the counter");
    // Slice with the knife in hand; the sliced apple still counts.
    let run = execute_ids(
        &task,
        &[
            id("find a Knife"),
            id("pick up the Knife"),
            id("find a Fridge"),
            id("slice the Apple"),
            id("open the Fridge"),
            id("slice the Apple"),
            id("slice the Apple"),
        ],
    );
    assert_eq!(run.step_valid, [true, true, true, false, true, true, false]);
    // Heat is order-independent: turn on first, then put in.
    let mut heat = task.clone();
    heat.task_type = TaskType::PickHeatThenPlace;
    let run = execute_ids(
        &heat,
        &[
            id("find a Apple"),
            id("open the Fridge"),
            id("pick up the Apple"),
            id("find a Microwave"),
            id("turn on the Microwave"),
            id("put down the object in hand"),
            id("pick up the Apple"),
            id("find a CounterTop"),
            id("put down the object in hand"),
        ],
    );
    assert!(run.success && run.step_valid.iter().all(|&v| v), "{run:?}");
    assert_eq!(expert_plan(&heat).len(), 9);
    // A plan that does not heat fails the heat goal.
    assert!(!execute_ids(&heat, &plan).success);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]
    #[test]
    fn random_plans_never_panic(index in 0usize..50, plan in prop::collection::vec(-10i32..100, 0..40)) {
        let task = generate_tasks(Split::Train, 5, 50).swap_remove(index);
        let run = execute_ids(&task, &plan);
        prop_assert_eq!(run.step_valid.len(), plan.len());
        let steps: Vec<PlanStep> = plan.iter().map(|&i| step(Some(i64::from(i) * 3), Some("find a Apple"))).collect();
        let run = execute(&task, &steps);
        prop_assert_eq!(run.step_valid.len(), plan.len());
    }
}

#[test]
fn splits_hold_out_pairs_and_a_phrasing() {
    for ty in TaskType::ALL {
        let goals = candidate_goals(ty);
        let unseen = goals
            .iter()
            .filter(|g| {
                let (o, r) = goal_pair(g);
                held_out_pair(o, r)
            })
            .count();
        assert!(
            unseen > 0 && unseen < goals.len(),
            "{ty}: {unseen} of {}",
            goals.len()
        );
    }
    let held_out_texts: Vec<String> = generate_tasks(Split::Unseen, 1, 300)
        .iter()
        .filter(|t| t.family == HELD_OUT_FAMILY)
        .map(|t| t.instruction.clone())
        .collect();
    assert!(held_out_texts.len() > 50);
    for split in [Split::Train, Split::Val] {
        for t in generate_tasks(split, 1, 1000) {
            let (o, r) = goal_pair(&t.goal);
            assert!(
                !held_out_pair(o, r),
                "{} uses held-out pair {o:?}/{r:?}",
                t.task_id
            );
            assert_ne!(t.family, HELD_OUT_FAMILY, "{}", t.task_id);
            assert_eq!(
                t.instruction,
                task::instruction(t.task_type, &t.goal, t.family)
            );
            // The held-out phrasing's wording never appears in train/val.
            for f in 0..FAMILIES {
                if f != HELD_OUT_FAMILY {
                    assert_ne!(
                        t.instruction,
                        task::instruction(t.task_type, &t.goal, HELD_OUT_FAMILY)
                    );
                }
            }
        }
    }
    for t in generate_tasks(Split::Unseen, 1, 300) {
        let (o, r) = goal_pair(&t.goal);
        assert!(held_out_pair(o, r), "{}", t.task_id);
    }
}

#[test]
fn rows_round_trip_and_bad_rows_name_the_task() {
    for task in mixed_tasks(30) {
        let row = task_row(&task);
        assert_eq!(row.suite, "household");
        assert_eq!(row.split, task.split.as_str());
        assert_eq!(row.task_type.as_deref(), Some(task.task_type.as_str()));
        let gt = row.gt_actions.as_ref().unwrap();
        let plan = expert_plan(&task);
        let plan: Vec<i64> = plan.into_iter().map(i64::from).collect();
        assert_eq!(gt.iter().map(|a| a.action_id).collect::<Vec<_>>(), plan);
        assert_eq!(task_from_row(&row).unwrap(), task);
    }
    let mut row = task_row(&generate_tasks(Split::Train, 2, 1)[0]);
    let text = String::from_utf8(row.observation.clone().unwrap()).unwrap();
    row.observation = Some(
        text.replacen("\"object\":\"", "\"object\":\"Unicorn", 1)
            .into_bytes(),
    );
    let err = task_from_row(&row).unwrap_err().to_string();
    assert!(
        err.contains("household/train/2/000000") && err.contains("Unicorn"),
        "{err}"
    );
    row.observation = Some(b"{not json".to_vec());
    assert!(
        task_from_row(&row)
            .unwrap_err()
            .to_string()
            .contains("bad observation JSON")
    );
    row.observation = None;
    assert!(
        task_from_row(&row)
            .unwrap_err()
            .to_string()
            .contains("no observation")
    );
}

#[test]
fn reseed_keeps_the_goal_and_changes_the_layout() {
    for task in mixed_tasks(20) {
        assert_eq!(reseed(&task, 0), task);
        for run in 1..3 {
            let other = reseed(&task, run);
            assert_eq!(other.task_id, task.task_id);
            assert_eq!(other.goal, task.goal);
            assert_eq!(other.task_type, task.task_type);
            assert_eq!(other.instruction, task.instruction);
            assert_eq!(other.scene.run, run);
            assert_ne!(other.scene.objects, task.scene.objects, "{}", task.task_id);
            assert_eq!(reseed(&task, run), other, "deterministic");
            assert!(execute_ids(&other, &expert_plan(&other)).success);
            assert_eq!(task_from_row(&task_row(&other)).unwrap(), other);
        }
    }
}

#[test]
fn prompts_are_short_and_list_the_scene_actions() {
    let tasks = generate_tasks(Split::Train, 4, 300);
    let mut max = 0;
    for task in &tasks {
        let text = prompt(task);
        max = max.max(text.len());
        for &i in &expert_plan(task) {
            let line = format!("\n{}: {}\n", i, action_list()[i as usize].name);
            assert!(text.contains(&line), "{line} missing from\n{text}");
        }
        assert!(text.ends_with(text::ASK));
    }
    assert!(max < 1500, "longest prompt {max}");
    let answer = response_json(&[16, 40, 9999, -1]);
    assert_eq!(
        answer,
        r#"{"language_plan":["find a Apple","pick up the Apple"],"executable_plan":[{"action_id":16,"action_name":"find a Apple"},{"action_id":40,"action_name":"pick up the Apple"}]}"#
    );
    assert_eq!(corpus(3, 1).len(), 6);
}

#[test]
fn split_and_task_type_names_parse() {
    for s in [Split::Train, Split::Val, Split::Unseen, Split::Test] {
        assert_eq!(s.to_string().parse::<Split>().unwrap(), s);
    }
    assert!(
        "holdout"
            .parse::<Split>()
            .unwrap_err()
            .to_string()
            .contains("`holdout`")
    );
    for t in TaskType::ALL {
        assert_eq!(t.as_str().parse::<TaskType>().unwrap(), t);
    }
}

#[test]
fn prompt_and_plan_length_stats() {
    let tasks = generate_tasks(Split::Train, 0, 1000);
    let lens: Vec<usize> = tasks.iter().map(|t| prompt(t).len()).collect();
    let plans: Vec<usize> = tasks.iter().map(|t| expert_plan(t).len()).collect();
    let answers: Vec<usize> = tasks
        .iter()
        .map(|t| response_json(&expert_plan(t)).len())
        .collect();
    let mean = |v: &[usize]| v.iter().sum::<usize>() as f64 / v.len() as f64;
    let max = |v: &[usize]| *v.iter().max().unwrap();
    println!(
        "prompt chars mean {:.0} max {}; expert plan steps mean {:.2} max {}; response chars mean {:.0} max {}",
        mean(&lens),
        max(&lens),
        mean(&plans),
        max(&plans),
        mean(&answers),
        max(&answers)
    );
    assert!(mean(&lens) < 1200.0);
}

fn id_steps(ids: &[i32]) -> Vec<PlanStep> {
    ids.iter()
        .map(|&id| PlanStep {
            action_id: Some(i64::from(id)),
            action_name: None,
        })
        .collect()
}

#[test]
fn the_rule_judge_flags_no_ops_removable_steps_and_steps_after_an_invalid_one() {
    let task = generate_tasks(Split::Train, 4, 1).remove(0);
    let expert = expert_plan(&task);
    let judged = judge(&task, &id_steps(&expert));
    assert!(
        judged
            .iter()
            .all(|j| j.reason == "ok" && j.causal && !j.redundant),
        "{judged:?}"
    );
    assert_eq!(
        judged[0].decision, 1.0,
        "a plan starts by finding something"
    );

    // Repeating the first step (a find) changes nothing: a no-op.
    let mut repeated = expert.clone();
    repeated.insert(1, expert[0]);
    let judged = judge(&task, &id_steps(&repeated));
    assert_eq!((judged[1].reason, judged[1].redundant), ("no-op", true));
    // With the repeat in place, the first of the two is removable as well.
    assert_eq!(judged[0].reason, "removable");
    assert!(judged[2..].iter().all(|j| !j.redundant), "{judged:?}");

    // A successful plan with a step it does not need: removable.
    let mut padded = expert.clone();
    padded.push(expert[0]);
    let judged = judge(&task, &id_steps(&padded));
    assert!(judged.last().unwrap().redundant, "{judged:?}");

    // An unknown id is invalid; every step after it is non-causal.
    let mut broken = expert.clone();
    broken.insert(1, 10_000);
    let judged = judge(&task, &id_steps(&broken));
    assert_eq!(judged[1].reason, "invalid");
    assert!(judged[1].causal && !judged[1].redundant);
    assert!(judged[2..].iter().all(|j| !j.causal));
    assert!(judged[..2].iter().all(|j| j.causal));
}

/// The pixel of `image` (side `size`) at `row`, `col`.
fn pixel(image: &[u8], size: usize, row: usize, col: usize) -> [u8; 3] {
    let at = (row * size + col) * 3;
    [image[at], image[at + 1], image[at + 2]]
}

/// The scene image shows each receptacle of the scene in its region (a
/// closed one with a dark door, an open one with a light door), each
/// object's colour, the agent in the doorway, and nothing in the region of
/// a receptacle the scene lacks; it is the same bytes every time.
#[test]
fn the_scene_image_maps_the_initial_state() {
    let size = 64;
    let cell = size / 4;
    for task in mixed_tasks(6) {
        let image = render::render(&task, size).unwrap();
        assert_eq!(image.len(), render::image_len(size));
        assert_eq!(image, render::render(&task, size).unwrap());
        let floor = pixel(&image, size, size - 1, size - 1);
        for (index, receptacle) in Receptacle::ALL.iter().enumerate() {
            let (top, left) = ((index / 4) * cell, (index % 4) * cell);
            let spot = task
                .scene
                .receptacles
                .iter()
                .find(|s| s.receptacle == *receptacle);
            // The block's top-left corner inside the inset.
            let corner = pixel(&image, size, top + 1, left + 1);
            match spot {
                None => assert_eq!(corner, floor, "{receptacle:?} absent"),
                Some(spot) => {
                    assert_ne!(corner, floor, "{receptacle:?} drawn");
                    if receptacle.openable() {
                        let door = pixel(&image, size, top + cell - 2, left + cell / 2);
                        let expected = if spot.open { [236; 3] } else { [24; 3] };
                        assert_eq!(door, expected, "{receptacle:?} door");
                    }
                }
            }
        }
        // Each object is a mark in its receptacle's block: without the
        // objects, exactly the blocks that held some change.
        let mut empty = task.clone();
        empty.scene.objects.clear();
        let bare = render::render(&empty, size).unwrap();
        for (index, receptacle) in Receptacle::ALL.iter().enumerate() {
            let (top, left) = ((index / 4) * cell, (index % 4) * cell);
            let differs = (top..top + cell).any(|r| {
                (left..left + cell).any(|c| pixel(&image, size, r, c) != pixel(&bare, size, r, c))
            });
            let holds = task.scene.objects.iter().any(|o| o.on == *receptacle);
            assert_eq!(differs, holds, "{receptacle:?}");
        }
        let agent = pixel(&image, size, 3 * cell + cell / 2, 3 * cell + cell / 2);
        assert_eq!(agent, [255; 3]);
    }
}

/// A row asks for its image by size; without one it is the bytes it always
/// was; the image read back from a row is the render of its task; a size
/// the renderer refuses is named, in the config and in a row.
#[test]
fn rows_carry_the_image_only_when_asked() {
    let task = &generate_tasks(Split::Val, 5, 1)[0];
    let plain = task_row(task);
    assert_eq!(image_task_row(task, None).unwrap(), plain);
    let text = String::from_utf8(plain.observation.clone().unwrap()).unwrap();
    assert!(!text.contains("image"), "{text}");
    assert_eq!(task_image(&plain).unwrap(), None);
    let row = image_task_row(task, Some(48)).unwrap();
    assert_eq!(task_from_row(&row).unwrap(), *task);
    let (size, image) = task_image(&row).unwrap().unwrap();
    assert_eq!(size, 48);
    assert_eq!(image, render::render(task, 48).unwrap());
    let err = image_task_row(task, Some(8)).unwrap_err().to_string();
    assert!(err.contains("size 8"), "{err}");
    let mut bad = row.clone();
    let text = String::from_utf8(bad.observation.unwrap()).unwrap();
    bad.observation = Some(
        text.replace("\"image_size\":48", "\"image_size\":4096")
            .into_bytes(),
    );
    let err = task_from_row(&bad).unwrap_err().to_string();
    assert!(err.contains(&task.task_id) && err.contains("4096"), "{err}");
}

#[test]
fn an_image_size_the_renderer_does_not_draw_is_named_with_the_sizes_drawn() {
    let (min, max) = (render::MIN_IMAGE_SIZE, render::MAX_IMAGE_SIZE);
    assert!(render::check_size(min).is_ok() && render::check_size(max).is_ok());
    let error = render::check_size(max + 1).unwrap_err().to_string();
    assert_eq!(
        error,
        format!(
            "scene image size {} is outside {min}..={max} pixels",
            max + 1
        )
    );
}
