use std::collections::BTreeSet;

use proptest::prelude::*;
use proptest::strategy::Strategy as _;

use super::*;
use crate::expert::Strategy;
use crate::scene::{Colour, Kind, ObjectSpec, Shape, Side, Size, TRAY_TRAVEL};
use crate::world::Z_MAX;

const PER_CELL: u64 = 40;

fn tasks(suite: Suite, split: Split, seed: u64, n: u64) -> Vec<TaskSpec> {
    (0..n).map(|i| generate(suite, split, seed, i)).collect()
}

fn expert_episode(
    task: &TaskSpec,
    strategy: Strategy,
    config: ExpertConfig,
) -> Result<Episode, TabletopError> {
    let mut world = World::new(task)?;
    let mut expert = Expert::new(&world, strategy, config)?;
    run_episode(&mut world, |w| expert.act(w))
}

/// A hand-built task for the kinematics tests.
fn scene(objects: Vec<ObjectSpec>, goals: Vec<Goal>) -> TaskSpec {
    TaskSpec {
        suite: "goal".into(),
        split: "train".into(),
        seed: 0,
        index: 0,
        run: 0,
        state: None,
        task_type: "test".into(),
        instruction: "test".into(),
        objects,
        goals,
        max_steps: 500,
        camera: Camera::Point,
    }
}

fn obj(kind: Kind, colour: Colour, x: f32, y: f32) -> ObjectSpec {
    ObjectSpec::new(kind, colour, Shape::Cube, Size::Small, x, y)
}

/// Drives the gripper to (x, y, z) with full-scale steps, `grip` held.
fn go(world: &mut World, to: [f32; 3], grip: f32) {
    for _ in 0..100 {
        let p = world.gripper().pos;
        let d = [
            (to[0] - p[0]) / 0.05,
            (to[1] - p[1]) / 0.05,
            (to[2] - p[2]) / 0.05,
        ];
        if d.iter().all(|v| v.abs() < 1e-4) {
            return;
        }
        world
            .step(&[
                d[0].clamp(-1.0, 1.0),
                d[1].clamp(-1.0, 1.0),
                d[2].clamp(-1.0, 1.0),
                grip,
            ])
            .unwrap();
    }
}

#[test]
fn generation_is_deterministic_and_ids_follow_the_key() {
    for suite in Suite::ALL {
        for split in LAYOUT_SPLITS {
            let a = generate(suite, split, 7, 42);
            assert_eq!(a, generate(suite, split, 7, 42));
            assert_eq!(a.task_id(), format!("tabletop-{suite}/{split}/7/000042"));
            assert_ne!(
                a.objects,
                generate(suite, split, 8, 42).objects,
                "{suite}/{split}"
            );
            a.validate().unwrap();
        }
    }
}

#[test]
fn the_noiseless_expert_solves_every_suite_and_split() {
    let mut report = Vec::new();
    for suite in Suite::ALL {
        for split in LAYOUT_SPLITS {
            let ts = tasks(suite, split, 3, PER_CELL);
            let mut solved = 0;
            for t in &ts {
                let e = expert_episode(t, Strategy::Grasp, ExpertConfig::default()).unwrap();
                if e.success {
                    solved += 1;
                    assert!(e.steps <= t.max_steps);
                } else {
                    eprintln!("expert failed {}: {}", t.task_id(), t.instruction);
                }
            }
            report.push(format!("{suite}/{split} {solved}/{}", ts.len()));
            assert!(solved as f64 >= 0.97 * ts.len() as f64, "{report:?}");
        }
    }
    eprintln!("noiseless expert: {}", report.join(", "));
}

#[test]
fn the_noisy_expert_mostly_solves_and_is_deterministic() {
    let mut solved = 0;
    let mut total = 0;
    for suite in Suite::ALL {
        for t in tasks(suite, Split::Train, 5, 25) {
            let config = ExpertConfig {
                noise: 0.3,
                seed: 9,
            };
            let e = expert_episode(&t, Strategy::Grasp, config).unwrap();
            assert_eq!(e, expert_episode(&t, Strategy::Grasp, config).unwrap());
            solved += usize::from(e.success);
            total += 1;
        }
    }
    eprintln!("expert with noise 0.3: {solved}/{total} solved");
    assert!(solved * 10 >= total * 9, "{solved}/{total}");
}

#[test]
fn pushing_solves_some_tasks_without_ever_grasping() {
    let mut pushed = 0;
    let mut tried = 0;
    for suite in Suite::ALL {
        for t in tasks(suite, Split::Train, 11, 60) {
            let e = match expert_episode(&t, Strategy::Push, ExpertConfig::default()) {
                Ok(e) => e,
                Err(TabletopError::NotPushable { .. }) => continue,
                Err(e) => panic!("{e}"),
            };
            tried += 1;
            assert!(!e.any_grasped, "the push strategy never grasps");
            pushed += usize::from(e.success);
        }
    }
    eprintln!("push strategy: {pushed}/{tried} pushable tasks solved without grasping");
    assert!(tried > 50 && pushed * 10 >= tried * 7, "{pushed}/{tried}");
}

#[test]
fn grasping_is_recorded_per_episode() {
    let t = generate(Suite::Object, Split::Train, 1, 0);
    let e = expert_episode(&t, Strategy::Grasp, ExpertConfig::default()).unwrap();
    assert!(e.success && e.target_ever_grasped);
    let mut world = World::new(&t).unwrap();
    let idle = run_episode(&mut world, |_| [0.0, 0.0, 0.0, -1.0]).unwrap();
    assert!(!idle.success && !idle.target_ever_grasped && idle.steps == t.max_steps);
    assert_eq!(world.status(), Status::TimedOut);
    let error = world.step(&[0.0; 4]).unwrap_err();
    assert!(
        matches!(error, TabletopError::EpisodeOver { steps: 100, .. }),
        "{error}"
    );
}

#[test]
fn unseen_holds_out_the_combinations_train_and_val_use() {
    let combo = |t: &TaskSpec| -> String {
        let goal_part = |g: &Goal| match *g {
            Goal::PlaceIn { object, target } => format!(
                "{}:{}->{:?}",
                t.objects[object].colour.as_str(),
                t.objects[object].shape.as_str(),
                t.objects[target].kind
            ),
            other => format!("{other:?}"),
        };
        match t.suite.as_str() {
            // The spatial relation and the goal are the instruction.
            "spatial" | "goal" => t.instruction.clone(),
            "object" => goal_part(&t.goals[0]),
            _ => {
                let first = t.goals.iter().find_map(Goal::moved_object).unwrap();
                format!("{}:{}", t.task_type, t.objects[first].colour.as_str())
            }
        }
    };
    for suite in Suite::ALL {
        let seen: BTreeSet<String> = [Split::Train, Split::Val]
            .into_iter()
            .flat_map(|s| tasks(suite, s, 2, 200))
            .map(|t| combo(&t))
            .collect();
        let unseen: BTreeSet<String> = tasks(suite, Split::Unseen, 2, 200)
            .iter()
            .map(combo)
            .collect();
        assert!(
            !unseen.is_empty() && seen.len() > unseen.len() / 2,
            "{suite}"
        );
        let both: Vec<&String> = seen.intersection(&unseen).collect();
        assert!(both.is_empty(), "{suite}: {both:?}");
    }
}

#[test]
fn the_goal_suite_shares_one_layout_and_val_draws_new_ones() {
    let train = tasks(Suite::Goal, Split::Train, 4, 12);
    assert!(train.iter().all(|t| t.objects == train[0].objects));
    let goals: BTreeSet<String> = train.iter().map(|t| t.instruction.clone()).collect();
    assert!(goals.len() >= 4, "{goals:?}");
    let unseen = tasks(Suite::Goal, Split::Unseen, 4, 5);
    assert!(unseen.iter().all(|t| t.objects == train[0].objects));
    let val = tasks(Suite::Goal, Split::Val, 4, 5);
    assert!(val.iter().all(|t| t.objects != train[0].objects));
    for suite in [Suite::Spatial, Suite::Object, Suite::Long] {
        let a = tasks(suite, Split::Train, 4, 5);
        let b = tasks(suite, Split::Val, 4, 5);
        for (x, y) in a.iter().zip(&b) {
            assert_ne!(x.objects, y.objects, "{suite}");
        }
    }
}

/// LIBERO's protocol: train / val / test initial states of one task.
fn states_of(suite: Suite, seed: u64, index: u64, n: u32) -> Vec<TaskSpec> {
    STATE_SPLITS
        .into_iter()
        .flat_map(|split| (0..n).map(move |s| initial_state(suite, seed, index, split, s).unwrap()))
        .collect()
}

#[test]
fn initial_state_splits_are_disjoint_states_of_the_same_tasks_and_deterministic_by_seed() {
    for suite in Suite::ALL {
        for index in 0..3 {
            let states = states_of(suite, 5, index, 8);
            let first = &states[0];
            let centre = &initial_state(suite, 5, index, Split::Train, 0).unwrap();
            assert_eq!(first, centre);
            let rows: Vec<_> = states.iter().map(task_row).collect();
            for (t, row) in states.iter().zip(&rows) {
                t.validate().unwrap();
                // The same task: scene, instruction, goals; the rows share the task key.
                assert_eq!(
                    (&t.instruction, &t.goals, &t.task_type, t.objects.len()),
                    (
                        &first.instruction,
                        &first.goals,
                        &first.task_type,
                        first.objects.len()
                    ),
                    "{}",
                    t.task_id()
                );
                assert_eq!(row.task_key(), rows[0].task_key());
                assert_eq!(row.task_key(), format!("tabletop-{suite}/5/{index:06}"));
                assert_eq!(
                    row.task_id,
                    format!("{}@{}/{:04}", row.task_key(), t.split, t.state.unwrap())
                );
                assert_eq!(task_from_row(row).unwrap(), *t);
                // Every object within its region around the task's layout.
                let layout = match protocol_tasks(suite) {
                    Some(_) => generate(Suite::Goal, Split::Train, 5, 0).objects,
                    None => generate(suite, Split::Train, 5, index).objects,
                };
                for (o, c) in t.objects.iter().zip(&layout) {
                    assert_eq!(
                        (o.kind, o.colour, o.shape, o.size),
                        (c.kind, c.colour, c.shape, c.size)
                    );
                    assert!(
                        (o.x - c.x).abs() <= REGION_HALF_WIDTH + 1e-6,
                        "{}",
                        t.task_id()
                    );
                    assert!(
                        (o.y - c.y).abs() <= REGION_HALF_WIDTH + 1e-6,
                        "{}",
                        t.task_id()
                    );
                }
            }
            // Disjoint: no two states (within or across splits) place the objects alike.
            for (i, a) in states.iter().enumerate() {
                for b in &states[i + 1..] {
                    assert_ne!(a.objects, b.objects, "{} vs {}", a.task_id(), b.task_id());
                }
            }
            let ids: BTreeSet<String> = rows.iter().map(|r| r.task_id.clone()).collect();
            let seeds: BTreeSet<i64> = rows.iter().map(|r| r.seed).collect();
            assert_eq!((ids.len(), seeds.len()), (states.len(), states.len()));
            // Deterministic by seed: the same key draws the same states, another seed others.
            assert_eq!(states, states_of(suite, 5, index, 8));
            let other = initial_state(suite, 6, index, Split::Train, 0).unwrap();
            assert_ne!(other.objects, first.objects, "{suite}");
            // A rerun of a state (evaluation's runs) keeps the task and moves within the regions.
            let again = reseed(&states[3], 1).unwrap();
            assert_eq!(
                (&again.goals, again.state, &again.split),
                (&states[3].goals, states[3].state, &states[3].split)
            );
            assert_ne!(again.objects, states[3].objects);
            assert_eq!(reseed(&states[3], 0).unwrap(), states[3]);
        }
    }
}

#[test]
fn the_goal_suite_has_its_seven_train_goals_as_tasks_and_no_unseen_states() {
    assert_eq!(protocol_tasks(Suite::Goal), Some(7));
    assert_eq!(protocol_tasks(Suite::Spatial), None);
    let tasks: Vec<TaskSpec> = (0..7)
        .map(|i| initial_state(Suite::Goal, 1, i, Split::Train, 0).unwrap())
        .collect();
    let words: BTreeSet<&str> = tasks.iter().map(|t| t.instruction.as_str()).collect();
    assert_eq!(words.len(), 7, "{words:?}");
    let unseen: BTreeSet<String> = (0..30)
        .map(|i| generate(Suite::Goal, Split::Unseen, 1, i).instruction)
        .collect();
    assert!(
        unseen.iter().all(|w| !words.contains(w.as_str())),
        "{unseen:?}"
    );
    let err = initial_state(Suite::Goal, 1, 7, Split::Train, 0).unwrap_err();
    assert!(err.to_string().contains("7 tasks, no task 7"), "{err}");
    let err = initial_state(Suite::Spatial, 1, 0, Split::Unseen, 0).unwrap_err();
    assert!(err.to_string().contains("held-out goals"), "{err}");
}

#[test]
fn the_noiseless_expert_solves_initial_states_of_every_suite() {
    for suite in Suite::ALL {
        let states: Vec<TaskSpec> = (0..4).flat_map(|i| states_of(suite, 2, i, 4)).collect();
        let solved = states
            .iter()
            .filter(|t| {
                expert_episode(t, Strategy::Grasp, ExpertConfig::default())
                    .unwrap()
                    .success
            })
            .count();
        assert!(
            solved as f64 >= 0.95 * states.len() as f64,
            "{suite}: {solved}/{}",
            states.len()
        );
    }
}

#[test]
fn reseeding_keeps_the_goal_and_moves_the_objects() {
    for suite in Suite::ALL {
        let t = generate(suite, Split::Train, 6, 3);
        let r = reseed(&t, 2).unwrap();
        assert_eq!(
            (&r.goals, &r.instruction, &r.task_type),
            (&t.goals, &t.instruction, &t.task_type)
        );
        assert_ne!(r.objects, t.objects, "{suite}");
        assert_eq!(reseed(&t, 0).unwrap(), t);
        let area = TaskSpec {
            camera: Camera::Area,
            ..t.clone()
        };
        assert_eq!(
            reseed(&area, 2).unwrap().camera,
            Camera::Area,
            "the camera stays"
        );
        assert!(
            expert_episode(&r, Strategy::Grasp, ExpertConfig::default())
                .unwrap()
                .success
        );
    }
}

#[test]
fn bad_actions_are_typed_errors_naming_the_value() {
    let mut world = World::new(&generate(Suite::Goal, Split::Train, 1, 1)).unwrap();
    let before = world.clone();
    for (action, dim) in [
        ([1.5, 0.0, 0.0, 0.0], 0),
        ([0.0, f32::NAN, 0.0, 0.0], 1),
        ([0.0, 0.0, f32::NEG_INFINITY, 0.0], 2),
        ([0.0, 0.0, 0.0, -1.01], 3),
    ] {
        let error = world.step(&action).unwrap_err();
        match &error {
            TabletopError::ActionOutOfRange { dim: d, value, .. } => {
                assert_eq!(*d, dim);
                assert!(value.is_nan() || *value == action[dim]);
            }
            other => panic!("{other}"),
        }
        assert!(
            error.to_string().contains(&format!("{}", action[dim])),
            "{error}"
        );
    }
    assert!(matches!(
        world.step(&[0.0; 3]),
        Err(TabletopError::ActionLength { found: 3, .. })
    ));
    assert_eq!(world, before, "a bad action changes nothing");
}

#[test]
fn tasks_the_world_cannot_build_are_clear_errors() {
    let good = generate(Suite::Long, Split::Train, 1, 1);
    let expect = |t: &TaskSpec, words: &str| {
        let error = World::new(t).unwrap_err().to_string();
        assert!(
            error.contains(words) && error.contains(&t.task_id()),
            "{error}"
        );
    };
    let mut t = good.clone();
    t.objects.truncate(1);
    t.goals.clear();
    expect(&t, "1 objects");
    let mut t = good.clone();
    t.objects[1].x = 1.2;
    expect(&t, "off the table");
    let mut t = good.clone();
    t.objects[1].y = f32::NAN;
    expect(&t, "not finite");
    let mut t = good.clone();
    (t.objects[2].x, t.objects[2].y) = (t.objects[1].x, t.objects[1].y);
    expect(&t, "overlap");
    let mut t = good.clone();
    t.goals.push(Goal::OpenDrawer { drawer: 9 });
    expect(&t, "names object 9");
    let mut t = good.clone();
    t.goals = vec![Goal::OpenDrawer { drawer: 1 }];
    expect(&t, "does not fit");
    let mut t = good.clone();
    t.max_steps = 0;
    expect(&t, "max_steps");
    let mut t = good;
    while t.objects.len() <= 6 {
        let mut extra = t.objects[1].clone();
        extra.x = 0.05 * t.objects.len() as f32;
        t.objects.push(extra);
    }
    expect(&t, "7 objects");
}

#[test]
fn rows_round_trip_and_bad_rows_are_named() {
    for suite in Suite::ALL {
        for split in LAYOUT_SPLITS {
            let t = generate(suite, split, 9, 4);
            let row = task_row(&t);
            assert_eq!(row.task_id, t.task_id());
            assert_eq!(row.suite, format!("tabletop-{suite}"));
            assert_eq!(row.task_type.as_deref(), Some(t.task_type.as_str()));
            assert!(row.gt_actions.is_none());
            assert_eq!(task_from_row(&row).unwrap(), t);
            let json = String::from_utf8(row.observation.clone().unwrap()).unwrap();
            assert!(
                !json.contains("camera"),
                "a point camera is not written: {json}"
            );
            let area = TaskSpec {
                camera: Camera::Area,
                ..t.clone()
            };
            assert_eq!(task_from_row(&task_row(&area)).unwrap(), area);
        }
    }
    let row = task_row(&generate(Suite::Goal, Split::Val, 9, 4));
    let named = |r: &embodyflow_core::schemas::TaskRow, words: &str| {
        let error = task_from_row(r).unwrap_err().to_string();
        assert!(
            error.contains(&row.task_id) && error.contains(words),
            "{error}"
        );
    };
    let mut r = row.clone();
    r.env = "household".into();
    named(&r, "env is `household`");
    let mut r = row.clone();
    r.observation = None;
    named(&r, "null");
    let mut r = row.clone();
    r.observation = Some(b"{\"suite\": 3}".to_vec());
    named(&r, "not a tabletop scene spec");
    let mut r = row.clone();
    r.instruction = "dance".into();
    named(&r, "column `instruction`");
    let mut r = row.clone();
    let mut t: TaskSpec = serde_json::from_slice(r.observation.as_deref().unwrap()).unwrap();
    t.objects[0].x = -0.5;
    r.observation = Some(serde_json::to_vec(&t).unwrap());
    named(&r, "off the table");
}

#[test]
fn a_grasped_block_is_carried_and_released_into_a_bowl() {
    let t = scene(
        vec![
            obj(Kind::Block, Colour::Red, 0.3, 0.4),
            obj(Kind::Bowl, Colour::White, 0.7, 0.6),
        ],
        vec![Goal::PlaceIn {
            object: 0,
            target: 1,
        }],
    );
    let mut w = World::new(&t).unwrap();
    go(&mut w, [0.3, 0.4, 0.25], -1.0);
    go(&mut w, [0.3, 0.4, 0.02], -1.0);
    assert_eq!(
        w.bodies()[0].pos,
        [0.3, 0.4],
        "descending onto a block does not push it"
    );
    w.step(&[0.0, 0.0, 0.0, 1.0]).unwrap();
    assert!(matches!(w.gripper().grip, Grip::Object { index: 0, .. }));
    go(&mut w, [0.69, 0.61, 0.2], 1.0);
    let b = &w.bodies()[0];
    assert!((b.pos[0] - 0.69).abs() < 1e-5 && (b.pos[1] - 0.61).abs() < 1e-5);
    assert!(b.z > 0.1 && b.support == Support::Held);
    assert!(!w.success());
    let out = w.step(&[0.0, 0.0, 0.0, -1.0]).unwrap();
    assert!(out.success && out.done);
    assert_eq!(
        w.bodies()[0].pos,
        w.bodies()[1].pos,
        "snapped into the bowl"
    );
    assert!(w.target_ever_grasped());
}

#[test]
fn a_low_gripper_pushes_a_block_onto_a_plate_and_the_bowl_carries_its_contents() {
    let t = scene(
        vec![
            obj(Kind::Block, Colour::Red, 0.3, 0.4),
            obj(Kind::Plate, Colour::White, 0.7, 0.4),
            obj(Kind::Bowl, Colour::Blue, 0.3, 0.75),
            obj(Kind::Block, Colour::Green, 0.6, 0.75),
        ],
        vec![Goal::PlaceIn {
            object: 0,
            target: 1,
        }],
    );
    let mut w = World::new(&t).unwrap();
    go(&mut w, [0.2, 0.4, 0.25], -1.0);
    go(&mut w, [0.2, 0.4, 0.01], -1.0);
    assert_eq!(w.bodies()[0].pos, [0.3, 0.4]);
    go(&mut w, [0.45, 0.4, 0.01], -1.0);
    let b = &w.bodies()[0];
    assert!(
        (b.pos[0] - 0.5).abs() < 1e-5 && (b.pos[1] - 0.4).abs() < 1e-5,
        "{:?}",
        b.pos
    );
    while w.status() == Status::Running && w.gripper().pos[0] < 0.66 {
        w.step(&[1.0, 0.0, 0.0, -1.0]).unwrap();
    }
    assert!(
        w.success() && !w.target_ever_grasped(),
        "pushed onto the plate"
    );
    assert_eq!(w.bodies()[0].support, Support::On(1));
    // A block in a bowl moves with the bowl when the bowl is pushed.
    let t = scene(
        vec![
            obj(Kind::Block, Colour::Red, 0.3, 0.4),
            obj(Kind::Bowl, Colour::White, 0.6, 0.4),
        ],
        vec![Goal::NextTo {
            object: 0,
            anchor: 1,
            side: Side::Left,
        }],
    );
    let mut w = World::new(&t).unwrap();
    go(&mut w, [0.3, 0.4, 0.25], -1.0);
    go(&mut w, [0.3, 0.4, 0.02], -1.0);
    w.step(&[0.0, 0.0, 0.0, 1.0]).unwrap();
    go(&mut w, [0.6, 0.4, 0.2], 1.0);
    w.step(&[0.0, 0.0, 0.0, -1.0]).unwrap();
    assert_eq!(w.bodies()[0].support, Support::On(1));
    let mut w2 = w.clone();
    go(&mut w2, [0.6, 0.25, 0.2], -1.0);
    go(&mut w2, [0.6, 0.25, 0.01], -1.0);
    go(&mut w2, [0.6, 0.4, 0.01], -1.0);
    assert!(w2.bodies()[1].pos[1] > 0.45, "the bowl was pushed");
    assert_eq!(
        w2.bodies()[0].pos,
        w2.bodies()[1].pos,
        "its block came along"
    );
}

#[test]
fn the_drawer_opens_by_its_handle_carries_its_contents_and_closes_by_a_push() {
    let mut drawer = obj(Kind::Drawer, Colour::Orange, 0.5, 0.85);
    drawer.size = Size::Large;
    let t = scene(
        vec![drawer, obj(Kind::Block, Colour::Red, 0.2, 0.3)],
        vec![
            Goal::OpenDrawer { drawer: 0 },
            Goal::PlaceIn {
                object: 1,
                target: 0,
            },
        ],
    );
    let mut w = World::new(&t).unwrap();
    // The cabinet stops a low gripper.
    go(&mut w, [0.5, 0.6, 0.1], -1.0);
    go(&mut w, [0.5, 0.85, 0.1], -1.0);
    assert!(w.gripper().pos[1] < 0.77, "{:?}", w.gripper().pos);
    let h = w.bodies()[0].handle();
    go(&mut w, [h[0], h[1], 0.05], -1.0);
    w.step(&[0.0, 0.0, 0.0, 1.0]).unwrap();
    assert_eq!(w.gripper().grip, Grip::Handle { drawer: 0 });
    for _ in 0..5 {
        w.step(&[0.7, -1.0, 0.5, 1.0]).unwrap();
    }
    assert!((w.bodies()[0].open - TRAY_TRAVEL).abs() < 1e-6);
    assert_eq!(
        [w.gripper().pos[0], w.gripper().pos[1]],
        w.bodies()[0].handle()
    );
    assert!(w.holds(&Goal::OpenDrawer { drawer: 0 }));
    w.step(&[0.0, 0.0, 0.0, -1.0]).unwrap();
    go(&mut w, [0.2, 0.3, 0.2], -1.0);
    go(&mut w, [0.2, 0.3, 0.02], -1.0);
    w.step(&[0.0, 0.0, 0.0, 1.0]).unwrap();
    let (lo, hi) = w.bodies()[0].tray();
    go(
        &mut w,
        [(lo[0] + hi[0]) / 2.0, (lo[1] + hi[1]) / 2.0, 0.15],
        1.0,
    );
    let out = w.step(&[0.0, 0.0, 0.0, -1.0]).unwrap();
    assert!(out.success, "opened and filled");
    // Push the tray shut: the block rides in it.
    let mut w = World::new(&scene(
        w.bodies()
            .iter()
            .enumerate()
            .map(|(i, b)| {
                let mut o = obj(b.kind, b.colour, t.objects[i].x, t.objects[i].y);
                o.size = b.size;
                o.open = if b.kind == Kind::Drawer {
                    TRAY_TRAVEL
                } else {
                    0.0
                };
                o
            })
            .collect(),
        vec![Goal::CloseDrawer { drawer: 0 }],
    ))
    .unwrap();
    let mut expert = Expert::new(&w, Strategy::Push, ExpertConfig::default()).unwrap();
    let e = run_episode(&mut w, |w| expert.act(w)).unwrap();
    assert!(e.success && !e.any_grasped && w.bodies()[0].open <= 0.01);
}

#[test]
fn a_block_released_over_the_cabinet_rests_on_top_and_can_be_taken_again() {
    let mut drawer = obj(Kind::Drawer, Colour::Orange, 0.5, 0.85);
    drawer.size = Size::Large;
    let t = scene(
        vec![drawer, obj(Kind::Block, Colour::Red, 0.2, 0.3)],
        vec![Goal::OpenDrawer { drawer: 0 }],
    );
    let mut w = World::new(&t).unwrap();
    go(&mut w, [0.2, 0.3, 0.25], -1.0);
    go(&mut w, [0.2, 0.3, 0.02], -1.0);
    w.step(&[0.0, 0.0, 0.0, 1.0]).unwrap();
    go(&mut w, [0.5, 0.85, 0.28], 1.0);
    w.step(&[0.0, 0.0, 0.0, -1.0]).unwrap();
    let b = &w.bodies()[1];
    assert_eq!((b.support, b.z), (Support::Top(0), 0.2));
    // The cabinet stops the gripper at its top; there it grasps the block.
    go(&mut w, [0.5, 0.85, 0.0], -1.0);
    assert!((w.gripper().pos[2] - 0.2).abs() < 1e-6);
    w.step(&[0.0, 0.0, 0.0, 1.0]).unwrap();
    assert!(matches!(w.gripper().grip, Grip::Object { index: 1, .. }));
}

#[test]
fn rendering_shows_each_object_in_its_colour_at_any_size() {
    let t = scene(
        vec![
            obj(Kind::Block, Colour::Red, 0.25, 0.3),
            obj(Kind::Plate, Colour::Yellow, 0.7, 0.3),
            obj(Kind::Bowl, Colour::Blue, 0.3, 0.7),
        ],
        vec![Goal::PlaceIn {
            object: 0,
            target: 1,
        }],
    );
    let w = World::new(&t).unwrap();
    for size in [8, 32, 48, 64] {
        let mut frame = vec![0u8; frame_len(size)];
        w.render(size, &mut frame).unwrap();
        let at = |x: f32, y: f32| {
            let col = ((x * size as f32) as usize).min(size - 1);
            let row = (((1.0 - y) * size as f32) as usize).min(size - 1);
            let i = (row * size + col) * 3;
            [frame[i], frame[i + 1], frame[i + 2]]
        };
        if size >= 32 {
            assert_eq!(at(0.25, 0.3), Colour::Red.rgb(), "size {size}");
            assert_eq!(at(0.7, 0.3), Colour::Yellow.rgb(), "size {size}");
            assert_ne!(
                at(0.3, 0.7),
                at(0.9, 0.9),
                "size {size}: the bowl differs from the table"
            );
        }
        let mut again = vec![1u8; frame_len(size)];
        w.render(size, &mut again).unwrap();
        assert_eq!(frame, again, "a frame depends on the state alone");
    }
    let mut small = vec![0u8; 10];
    assert!(matches!(
        w.render(32, &mut small),
        Err(TabletopError::FrameBuffer { found: 10, .. })
    ));
    assert!(matches!(
        w.render(4, &mut small),
        Err(TabletopError::FrameSize { size: 4, .. })
    ));
}

/// The column of a red block's intensity-weighted centre in row `row` of
/// a frame (red minus the table's red, per pixel).
fn red_centre(frame: &[u8], size: usize, row: usize) -> f32 {
    let (mut mass, mut moment) = (0.0f32, 0.0f32);
    for col in 0..size {
        let excess = (f32::from(frame[(row * size + col) * 3]) - 128.0).max(0.0);
        mass += excess;
        moment += excess * (col as f32 + 0.5);
    }
    moment / mass
}

#[test]
fn the_area_camera_shows_an_eighth_of_a_pixel_of_motion_and_the_point_camera_whole_pixels() {
    let frame_of = |camera: Camera, x: f32| {
        let mut t = scene(
            vec![
                obj(Kind::Block, Colour::Red, x, 0.5),
                obj(Kind::Plate, Colour::Yellow, 0.8, 0.2),
            ],
            vec![Goal::PlaceIn {
                object: 0,
                target: 1,
            }],
        );
        t.camera = camera;
        let mut frame = vec![0u8; frame_len(32)];
        World::new(&t).unwrap().render(32, &mut frame).unwrap();
        frame
    };
    let row = 16; // the row through y = 0.5
    let pixel = 1.0 / 32.0;
    let (base, step) = (0.3 + 0.1 * pixel, pixel / 8.0);
    let (mut point_changes, mut area_error) = (0, 0.0f32);
    for k in 0..8 {
        let x = base + k as f32 * step;
        point_changes +=
            usize::from(frame_of(Camera::Point, x) != frame_of(Camera::Point, x + step));
        let area = frame_of(Camera::Area, x);
        assert_ne!(
            area,
            frame_of(Camera::Area, x + step),
            "x {x}: an eighth of a pixel shows"
        );
        area_error = area_error.max((red_centre(&area, 32, row) / 32.0 - x).abs());
    }
    assert!(
        point_changes <= 2,
        "the point camera moves in whole pixels: {point_changes} changes over one pixel"
    );
    assert!(
        area_error < 0.1 * pixel,
        "the area camera's centre of red follows the block: error {area_error}"
    );
    // Colours are exact inside a part and mixed at its edges only.
    let area = frame_of(Camera::Area, 0.5);
    let at = |col: usize| {
        [
            area[(row * 32 + col) * 3],
            area[(row * 32 + col) * 3 + 1],
            area[(row * 32 + col) * 3 + 2],
        ]
    };
    assert_eq!(at(16), Colour::Red.rgb());
    assert_eq!(at(2), [128, 98, 70], "the table");
}

#[test]
fn noise_must_be_finite_and_not_negative() {
    let w = World::new(&generate(Suite::Goal, Split::Train, 1, 1)).unwrap();
    for noise in [-0.1, f32::NAN] {
        let config = ExpertConfig { noise, seed: 0 };
        assert!(matches!(
            Expert::new(&w, Strategy::Grasp, config),
            Err(TabletopError::BadNoise(_))
        ));
    }
}

fn any_task() -> impl proptest::strategy::Strategy<Value = TaskSpec> {
    (0usize..4, 0usize..3, 0u64..50, 0u64..50)
        .prop_map(|(s, p, seed, i)| generate(Suite::ALL[s], LAYOUT_SPLITS[p], seed, i))
}

fn actions(n: usize) -> impl proptest::strategy::Strategy<Value = Vec<[f32; 4]>> {
    proptest::collection::vec(
        // dz leans down, where grasps and pushes happen.
        [-1.0f32..=1.0, -1.0f32..=1.0, -1.0f32..=0.4, -1.0f32..=1.0],
        1..n,
    )
}

/// Steps `world` through `actions` (until the episode ends), calling
/// `check(before, after)` after each step.
fn step_all(world: &mut World, actions: &[[f32; 4]], mut check: impl FnMut(&World, &World)) {
    for a in actions {
        if world.status() != Status::Running {
            break;
        }
        let before = world.clone();
        world.step(a).unwrap();
        check(&before, world);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn positions_stay_on_the_table(task in any_task(), acts in actions(120)) {
        let mut w = World::new(&task).unwrap();
        step_all(&mut w, &acts, |_, w| {
            let g = w.gripper().pos;
            assert!((0.0..=1.0).contains(&g[0]) && (0.0..=1.0).contains(&g[1]) && (0.0..=Z_MAX).contains(&g[2]), "{g:?}");
            for b in w.bodies() {
                assert!(b.pos.iter().all(|v| v.is_finite() && (0.0..=1.0).contains(v)), "{b:?}");
                assert!(b.z >= 0.0 && b.z <= Z_MAX, "{b:?}");
                if b.kind == Kind::Drawer {
                    assert!((0.0..=TRAY_TRAVEL).contains(&b.open));
                }
            }
        });
    }

    #[test]
    fn a_grasped_object_moves_with_the_gripper(task in any_task(), acts in actions(120)) {
        let mut w = World::new(&task).unwrap();
        step_all(&mut w, &acts, |before, after| {
            if let (Grip::Object { index: i, offset }, Grip::Object { index: j, .. }) = (before.gripper().grip, after.gripper().grip) {
                assert_eq!(i, j);
                let (g, b) = (after.gripper().pos, &after.bodies()[i]);
                let r = b.radius;
                assert!((b.pos[0] - (g[0] + offset[0]).clamp(r, 1.0 - r)).abs() < 1e-5);
                assert!((b.pos[1] - (g[1] + offset[1]).clamp(r, 1.0 - r)).abs() < 1e-5);
                assert!((b.z - (g[2] - offset[2]).max(0.0)).abs() < 1e-5);
                assert_eq!(b.support, Support::Held);
            }
        });
    }

    #[test]
    fn the_same_task_and_actions_give_the_same_states_and_frames(task in any_task(), acts in actions(60)) {
        let (mut a, mut b) = (World::new(&task).unwrap(), World::new(&task).unwrap());
        let (mut fa, mut fb) = (vec![0u8; frame_len(32)], vec![7u8; frame_len(32)]);
        for act in &acts {
            if a.status() != Status::Running {
                break;
            }
            prop_assert_eq!(a.step(act).unwrap(), b.step(act).unwrap());
            prop_assert_eq!(&a, &b);
            a.render(32, &mut fa).unwrap();
            b.render(32, &mut fb).unwrap();
            prop_assert_eq!(&fa, &fb);
        }
    }

    #[test]
    fn rendering_stays_in_bounds_at_any_size_and_state(task in any_task(), acts in actions(60), size in 8usize..80) {
        let mut w = World::new(&task).unwrap();
        let mut frame = vec![0u8; frame_len(size)];
        step_all(&mut w, &acts, |_, w| {
            w.render(size, &mut frame).unwrap();
        });
        // Every pixel is painted: nothing of the caller's buffer survives.
        let mut marked = vec![1u8; frame_len(size)];
        w.render(size, &mut marked).unwrap();
        prop_assert_eq!(marked, frame);
    }

    #[test]
    fn actions_outside_the_box_never_panic(x in proptest::num::f32::ANY, dim in 0usize..4) {
        let mut w = World::new(&generate(Suite::Spatial, Split::Train, 0, 0)).unwrap();
        let mut a = [0.0f32; 4];
        a[dim] = x;
        let r = w.step(&a);
        prop_assert_eq!(r.is_ok(), (-1.0..=1.0).contains(&x));
    }
}

#[test]
fn a_batch_steps_its_episodes_as_they_step_alone() {
    let tasks = vec![
        generate(Suite::Object, Split::Train, 2, 0),
        generate(Suite::Long, Split::Train, 2, 1),
    ];
    let (group, k) = (3, 8);
    let mut batch = Batch::new(&tasks, group, 32).unwrap();
    assert_eq!(batch.len(), 6);
    assert_eq!(
        batch.world(1),
        batch.world(2),
        "a group shares its initial state"
    );
    let mut alone: Vec<World> = (0..6).map(|i| batch.world(i).clone()).collect();
    // Episode 0 follows its expert; the others wander with noise.
    let mut expert = Expert::new(&alone[0], Strategy::Grasp, ExpertConfig::default()).unwrap();
    let mut rng = 0u64;
    let mut wander = || {
        rng = rng
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((rng >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    };
    let mut frame = vec![0u8; frame_len(32)];
    for _ in 0..30 {
        batch.observe();
        for (i, w) in alone.iter().enumerate() {
            w.render(32, &mut frame).unwrap();
            assert_eq!(
                &batch.frames()[i * frame.len()..(i + 1) * frame.len()],
                &frame[..]
            );
            assert_eq!(&batch.proprio()[i * 5..(i + 1) * 5], &w.proprio()[..]);
        }
        let mut chunk = Vec::new();
        let mut probe = alone[0].clone();
        for _ in 0..k {
            let a = if probe.status() == Status::Running {
                expert.act(&probe)
            } else {
                [0.0; 4]
            };
            if probe.status() == Status::Running {
                probe.step(&a).unwrap();
            }
            chunk.extend_from_slice(&a);
        }
        for _ in 1..6 {
            for _ in 0..k * 4 {
                chunk.push(wander());
            }
        }
        let outcomes = batch.step_chunks(&chunk, k).unwrap();
        for (i, w) in alone.iter_mut().enumerate() {
            let mut steps = 0;
            for a in chunk[i * k * 4..(i + 1) * k * 4].chunks_exact(4) {
                if w.status() == Status::Running {
                    w.step(a).unwrap();
                    steps += 1;
                }
            }
            assert_eq!(outcomes[i].env_steps, steps);
            assert_eq!(outcomes[i].done, w.status() != Status::Running);
            assert_eq!(batch.world(i), w);
        }
        if batch.all_done() {
            break;
        }
    }
    assert!(
        batch.world(0).status() == Status::Success,
        "the expert's chunks solve episode 0"
    );
    // A bad chunk steps nothing and names the place.
    let before: Vec<World> = (0..6).map(|i| batch.world(i).clone()).collect();
    let mut chunk = vec![0.0f32; 6 * 2 * 4];
    chunk[4 * 2 * 4 + 4 + 2] = f32::NAN;
    let error = batch.step_chunks(&chunk, 2).unwrap_err();
    assert!(
        matches!(
            error,
            TabletopError::ChunkValue {
                episode: 4,
                action: 1,
                dim: 2,
                ..
            }
        ),
        "{error}"
    );
    let error = batch.step_chunks(&chunk[1..], 2).unwrap_err().to_string();
    assert!(
        error.contains("6 episodes") && error.contains("47"),
        "{error}"
    );
    assert!(batch.step_chunks(&[], 0).is_err());
    assert!((0..6).all(|i| batch.world(i) == &before[i]));
    assert!(matches!(
        Batch::new(&tasks, 2, 2),
        Err(TabletopError::FrameSize { .. })
    ));
}

/// DART's labels: with planned labels the noisy expert takes the very same
/// episode (the noise still moves it), but every label is the plan before
/// the noise; the labels differ from the executed actions exactly where the
/// expert moved, and never in the grip command. Without noise both agree.
#[test]
fn planned_labels_keep_the_noisy_episode_and_label_the_plan() {
    let task = generate(Suite::Goal, Split::Train, 8, 1);
    let noisy = ExpertConfig {
        noise: 0.3,
        seed: 5,
    };
    let executed = demonstration(&task, Strategy::Grasp, noisy, Labels::Executed, 1, 32).unwrap();
    let planned = demonstration(&task, Strategy::Grasp, noisy, Labels::Planned, 1, 32).unwrap();
    assert_eq!(executed.episode, planned.episode);
    let mut differ = 0;
    for (e, p) in executed.decisions.iter().zip(&planned.decisions) {
        assert_eq!(
            (&e.frame, e.proprio),
            (&p.frame, p.proprio),
            "the same states"
        );
        let (a, b) = (e.actions[0], p.actions[0]);
        assert_eq!(a[3], b[3], "the grip command takes no noise");
        assert!(b[..3].iter().all(|v| v.abs() <= 1.0));
        differ += usize::from(a != b);
    }
    assert!(
        differ * 2 > executed.decisions.len(),
        "{differ} of {}",
        executed.decisions.len()
    );
    let clean = ExpertConfig::default();
    let a = demonstration(&task, Strategy::Grasp, clean, Labels::Executed, 8, 32).unwrap();
    let b = demonstration(&task, Strategy::Grasp, clean, Labels::Planned, 8, 32).unwrap();
    assert_eq!(a.decisions, b.decisions);
}

#[test]
fn a_demonstration_replays_chunk_by_chunk_to_success() {
    for suite in Suite::ALL {
        let task = generate(suite, Split::Val, 8, 2);
        let config = ExpertConfig {
            noise: 0.2,
            seed: 4,
        };
        let demo = demonstration(&task, Strategy::Grasp, config, Labels::Executed, 8, 32).unwrap();
        assert!(demo.episode.success, "{suite}");
        assert_eq!(
            demo.decisions.len(),
            (demo.episode.steps as usize).div_ceil(8)
        );
        let mut world = World::new(&task).unwrap();
        let mut frame = vec![0u8; frame_len(32)];
        for d in &demo.decisions {
            world.render(32, &mut frame).unwrap();
            assert_eq!((&d.frame, d.proprio), (&frame, world.proprio()));
            assert_eq!(d.actions.len(), 8);
            for a in &d.actions {
                if world.status() == Status::Running {
                    world.step(a).unwrap();
                } else {
                    assert_eq!(a[..3], [0.0; 3], "padding holds still");
                }
            }
        }
        assert_eq!(world.status(), Status::Success);
        assert_eq!(world.steps(), demo.episode.steps);
    }
    let task = generate(Suite::Goal, Split::Train, 8, 2);
    let config = ExpertConfig::default();
    assert!(demonstration(&task, Strategy::Grasp, config, Labels::Executed, 0, 32).is_err());
    assert!(demonstration(&task, Strategy::Grasp, config, Labels::Executed, 8, 3).is_err());
}

#[test]
fn next_to_sides_point_their_way() {
    let t = generate(Suite::Goal, Split::Train, 1, 0);
    let a = &t.objects[2];
    let spot = crate::suite::next_to_spot([a.x, a.y], a.radius(), 0.03, Side::Left);
    assert!(spot[0] < a.x && (spot[1] - a.y).abs() < 1e-6);
}
