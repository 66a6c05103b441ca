use super::*;
use embodyflow_core::observation::decode;
use embodyflow_tabletop::{
    ACTION_DIM, Expert, ExpertConfig, ExpertPolicy, PROPRIO_DIM, Split, Status, Strategy, Suite,
    TabletopEpisodes, TaskSpec, World, frame_len, generate, run_episode,
};

const SIZE: usize = 32;
const K: usize = 8;

fn shape() -> ObservationShape {
    ObservationShape {
        height: SIZE,
        width: SIZE,
        channels: 3,
        proprio: PROPRIO_DIM,
    }
}

fn config(max_decisions: usize) -> ClosedLoopConfig<'static> {
    ClosedLoopConfig {
        max_decisions,
        label: "closed loop (test)",
    }
}

/// Instructions as their bytes: the scripted policies need no tokenizer.
fn byte_ids(instruction: &str) -> Vec<i32> {
    instruction.bytes().map(i32::from).collect()
}

/// Uniform random tokens drawn from each row's seed (BLAKE3's output
/// stream, one byte per token of 256 bins).
struct RandomPolicy;

impl ChunkPolicy for RandomPolicy {
    type Error = embodyflow_core::Error;

    fn chunk_len(&self) -> usize {
        K
    }

    fn action_dim(&self) -> usize {
        ACTION_DIM
    }

    fn observation_shape(&self) -> ObservationShape {
        shape()
    }

    fn instruction_ids(&self, instruction: &str) -> Result<Vec<i32>, Self::Error> {
        Ok(byte_ids(instruction))
    }

    fn decide(&mut self, batch: &DecisionBatch<'_>) -> Result<Vec<ChunkDecision>, Self::Error> {
        Ok(batch
            .seeds
            .iter()
            .map(|seed| {
                let mut bytes = [0u8; K * ACTION_DIM];
                blake3::Hasher::new()
                    .update(&seed.to_le_bytes())
                    .finalize_xof()
                    .fill(&mut bytes);
                ChunkDecision {
                    tokens: bytes.iter().map(|&b| u32::from(b)).collect(),
                    thought: None,
                    token_logprobs: vec![-(256f32.ln()); K * ACTION_DIM],
                }
            })
            .collect())
    }
}

/// The random policy, with one episode's decision spoiled.
struct Faulty {
    episode: usize,
    decision: usize,
    spoil: fn(&mut ChunkDecision),
}

impl ChunkPolicy for Faulty {
    type Error = embodyflow_core::Error;

    fn chunk_len(&self) -> usize {
        K
    }

    fn action_dim(&self) -> usize {
        ACTION_DIM
    }

    fn observation_shape(&self) -> ObservationShape {
        shape()
    }

    fn instruction_ids(&self, instruction: &str) -> Result<Vec<i32>, Self::Error> {
        Ok(byte_ids(instruction))
    }

    fn decide(&mut self, batch: &DecisionBatch<'_>) -> Result<Vec<ChunkDecision>, Self::Error> {
        let mut out = RandomPolicy.decide(batch)?;
        if batch.decision == self.decision
            && let Some(r) = batch.episodes.iter().position(|&e| e == self.episode)
        {
            (self.spoil)(&mut out[r]);
        }
        Ok(out)
    }
}

fn tasks(per_suite: u64) -> Vec<TaskSpec> {
    Suite::ALL
        .iter()
        .flat_map(|&suite| (0..per_suite).map(move |i| generate(suite, Split::Train, 11, i)))
        .collect()
}

fn seeds(n: usize, run: u64) -> Vec<u64> {
    (0..n as u64).map(|i| run * 1000 + i).collect()
}

fn run<P: ChunkPolicy>(
    tasks: &[TaskSpec],
    group: usize,
    policy: &mut P,
    seeds: &[u64],
    max_decisions: usize,
) -> Result<Vec<ClosedLoopEpisode>, ClosedLoopError> {
    let mut world = TabletopEpisodes::new(tasks, group, SIZE).unwrap();
    let run = run_closed_loop(
        &mut world,
        policy,
        &ActionBins::openvla(),
        seeds,
        &config(max_decisions),
    )?;
    let decisions = run.episodes.iter().map(|e| e.decisions.len() as u64);
    assert_eq!(run.decisions, decisions.sum::<u64>());
    let env_steps = run.episodes.iter().map(|e| u64::from(e.env_steps));
    assert_eq!(run.env_steps, env_steps.sum::<u64>());
    assert!(run.world_seconds > 0.0 && run.policy_seconds > 0.0);
    Ok(run.episodes)
}

/// Replays an episode's recorded decisions in a fresh world: each
/// observation must decode to what the world shows, and the tokens, decoded
/// to bin centres, must take the world to the recorded outcome.
fn replay(task: &TaskSpec, episode: &ClosedLoopEpisode) {
    let bins = ActionBins::openvla();
    let mut world = World::new(task).unwrap();
    let mut frame = vec![0u8; frame_len(SIZE)];
    for (n, d) in episode.decisions.iter().enumerate() {
        let observation = decode(&d.observation).unwrap();
        observation.expect_shape(&shape()).unwrap();
        world.render(SIZE, &mut frame).unwrap();
        assert_eq!(observation.pixels, frame, "decision {n}");
        assert_eq!(observation.proprio, world.proprio(), "decision {n}");
        let actions = bins.decode(&d.tokens).unwrap();
        let last = n + 1 == episode.decisions.len();
        assert!(d.env_steps as usize == K || last, "decision {n}");
        for action in actions.chunks_exact(ACTION_DIM).take(d.env_steps as usize) {
            world.step(action).unwrap();
        }
    }
    assert_eq!(world.steps(), episode.env_steps);
    assert_eq!(world.status() == Status::Success, episode.success);
    assert_eq!(world.status() == Status::Running, episode.truncated);
    assert_eq!(
        Some(world.target_ever_grasped()),
        episode.target_ever_grasped
    );
}

#[test]
fn the_expert_as_a_token_policy_succeeds_as_the_expert_does_and_replays() {
    let tasks = tasks(3);
    let group = 2;
    let mut policy = ExpertPolicy::new(&tasks, group, SIZE, K, Strategy::Grasp, 0.0).unwrap();
    let n = tasks.len() * group;
    let episodes = run(&tasks, group, &mut policy, &seeds(n, 0), 1000).unwrap();
    let mut expert_successes = 0;
    for task in &tasks {
        let mut world = World::new(task).unwrap();
        let mut expert = Expert::new(&world, Strategy::Grasp, ExpertConfig::default()).unwrap();
        expert_successes += run_episode(&mut world, |w| expert.act(w)).unwrap().success as usize;
    }
    let successes = episodes.iter().filter(|e| e.success).count();
    // Both copies of a task see the same noiseless expert.
    assert!(
        successes + 1 >= group * expert_successes,
        "{successes} of {n} vs the expert's {expert_successes} of {}",
        tasks.len()
    );
    for (i, episode) in episodes.iter().enumerate() {
        let task = &tasks[i / group];
        assert_eq!(episode.task_id, task.task_id());
        assert_eq!(episode.prompt_ids, byte_ids(&task.instruction));
        assert_eq!(
            episode.decisions.len(),
            (episode.env_steps as usize).div_ceil(K)
        );
        replay(task, episode);
    }
    // Grasp tasks that succeeded grasped their object.
    assert!(
        episodes
            .iter()
            .any(|e| e.success && e.target_ever_grasped == Some(true))
    );
}

#[test]
fn noisy_copies_of_a_task_differ_and_still_replay() {
    let tasks = tasks(1);
    let mut policy = ExpertPolicy::new(&tasks, 3, SIZE, K, Strategy::Grasp, 0.3).unwrap();
    let episodes = run(&tasks, 3, &mut policy, &seeds(12, 0), 1000).unwrap();
    for (i, episode) in episodes.iter().enumerate() {
        replay(&tasks[i / 3], episode);
    }
    // Copies start from the task's state: the same first observation.
    assert_eq!(
        episodes[0].decisions[0].observation,
        episodes[1].decisions[0].observation
    );
    assert_ne!(episodes[0].decisions, episodes[1].decisions);
}

#[test]
fn a_run_is_determined_by_its_seeds_whatever_batch_an_episode_is_in() {
    let tasks = tasks(1);
    let n = tasks.len() * 2;
    let first = run(&tasks, 2, &mut RandomPolicy, &seeds(n, 1), 6).unwrap();
    assert_eq!(
        first,
        run(&tasks, 2, &mut RandomPolicy, &seeds(n, 1), 6).unwrap()
    );
    assert_ne!(
        first,
        run(&tasks, 2, &mut RandomPolicy, &seeds(n, 2), 6).unwrap()
    );
    // Episode 5 (task 2, copy 1) alone, with its seed.
    let alone = run(&tasks[2..3], 1, &mut RandomPolicy, &seeds(n, 1)[5..6], 6).unwrap();
    assert_eq!(alone[0], first[5]);
    for (i, episode) in first.iter().enumerate() {
        replay(&tasks[i / 2], episode);
        // Random tokens do not solve a task in 48 steps: cut, a failure.
        assert!(episode.truncated && !episode.success);
        assert_eq!(episode.decisions.len(), 6);
        assert_eq!(episode.env_steps as usize, 6 * K);
    }
}

#[test]
fn an_episode_at_the_worlds_max_steps_is_a_failure_not_an_error() {
    let mut tasks = tasks(1);
    for task in &mut tasks {
        task.max_steps = 13;
    }
    let episodes = run(&tasks, 2, &mut RandomPolicy, &seeds(8, 3), 1000).unwrap();
    for (i, episode) in episodes.iter().enumerate() {
        assert!(!episode.success && !episode.truncated, "{episode:?}");
        assert_eq!(episode.env_steps, 13);
        assert_eq!(
            episode
                .decisions
                .iter()
                .map(|d| d.env_steps)
                .collect::<Vec<_>>(),
            [8, 5]
        );
        replay(&tasks[i / 2], episode);
        // The last chunk ran 5 of its 8 actions: its 3 others are masked
        // out of learning, the full first chunk has no mask.
        let rows = episode.step_rows("it0/t/d0/s0");
        assert_eq!(rows[0].response_mask, None);
        let mask = rows[1]
            .response_mask
            .as_ref()
            .expect("a cut chunk is masked");
        assert_eq!(mask.len(), K * ACTION_DIM);
        assert!(mask[..5 * ACTION_DIM].iter().all(|&m| m), "{mask:?}");
        assert!(mask[5 * ACTION_DIM..].iter().all(|&m| !m), "{mask:?}");
    }
}

#[test]
fn a_bad_policy_output_is_an_error_naming_the_episode() {
    let tasks = tasks(1);
    let out_of_range: fn(&mut ChunkDecision) = |d| d.tokens[3] = 256;
    let short: fn(&mut ChunkDecision) = |d| {
        d.tokens.pop();
    };
    let nan: fn(&mut ChunkDecision) = |d| d.token_logprobs[0] = f32::NAN;
    for (spoil, expected) in [
        (
            out_of_range,
            "action token 256 at position 3 is outside 0..256",
        ),
        (short, "31 tokens and 32 log-probs"),
        (nan, "log-prob NaN of token 0"),
    ] {
        let mut policy = Faulty {
            episode: 5,
            decision: 2,
            spoil,
        };
        let error = run(&tasks, 2, &mut policy, &seeds(8, 0), 10).unwrap_err();
        let text = error.to_string();
        assert!(
            text.starts_with(&format!(
                "episode 5 (task `{}`), decision 2: ",
                tasks[2].task_id()
            )) && text.contains(expected),
            "{text}"
        );
        assert_eq!(error.kind(), ErrorKind::Failure);
    }
}

#[test]
fn a_policy_for_other_observations_or_actions_is_refused_before_any_step() {
    struct Wide;
    impl ChunkPolicy for Wide {
        type Error = embodyflow_core::Error;
        fn chunk_len(&self) -> usize {
            K
        }
        fn action_dim(&self) -> usize {
            ACTION_DIM
        }
        fn observation_shape(&self) -> ObservationShape {
            ObservationShape {
                height: 48,
                width: 48,
                ..shape()
            }
        }
        fn instruction_ids(&self, _: &str) -> Result<Vec<i32>, Self::Error> {
            Err(embodyflow_core::Error::BadInput("not reached".into()))
        }
        fn decide(&mut self, _: &DecisionBatch<'_>) -> Result<Vec<ChunkDecision>, Self::Error> {
            unreachable!("refused before any decision")
        }
    }
    let tasks = tasks(1);
    let error = run(&tasks, 1, &mut Wide, &seeds(4, 0), 10).unwrap_err();
    assert_eq!(
        error.to_string(),
        "the world's observations do not fit the policy: observation is 32x32x3 image + 5 proprio, \
         expected 48x48x3 image + 5 proprio"
    );
    assert_eq!(error.kind(), ErrorKind::BadInput);
    let error = run(&tasks, 1, &mut RandomPolicy, &seeds(3, 0), 10).unwrap_err();
    assert_eq!(error.to_string(), "3 sampling seeds for 4 episodes");
}

#[test]
fn step_rows_carry_each_decision() {
    let tasks = tasks(1);
    let episodes = run(&tasks[..1], 1, &mut RandomPolicy, &seeds(1, 0), 3).unwrap();
    let rows = episodes[0].step_rows("it0/t/d0/s0");
    assert_eq!(rows.len(), 3);
    for (index, (row, d)) in rows.iter().zip(&episodes[0].decisions).enumerate() {
        assert_eq!(row.step_index, index as i32);
        assert_eq!(row.trajectory_id, "it0/t/d0/s0");
        assert_eq!(row.prompt_ids, episodes[0].prompt_ids);
        assert_eq!(
            row.response_ids,
            d.tokens.iter().map(|&t| t as i32).collect::<Vec<_>>()
        );
        assert_eq!(row.old_logprobs, d.token_logprobs);
        assert_eq!(row.observation.as_deref(), Some(&d.observation[..]));
        assert!(row.old_value.is_none() && row.latents.is_none());
    }
}

#[test]
fn step_rows_survive_the_steps_table_and_decode_from_it() {
    use embodyflow_core::dataset::{TableReader, TableWriter, WriteOptions};
    use embodyflow_core::manifest::Producer;
    use embodyflow_core::schemas::TableName;
    let tasks = tasks(1);
    let episodes = run(&tasks, 2, &mut RandomPolicy, &seeds(8, 4), 4).unwrap();
    let rows: Vec<StepRow> = episodes
        .iter()
        .enumerate()
        .flat_map(|(i, e)| e.step_rows(&format!("it0/{}/d0/s{}", e.task_id, i % 2)))
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let mut writer =
        TableWriter::create(dir.path(), TableName::Steps, WriteOptions::default(), false).unwrap();
    writer.write_rows(&rows).unwrap();
    let producer = Producer {
        stage: "test".into(),
        version: "0".into(),
        config: serde_json::json!({}),
        seed: 0,
        shard: "0/1".into(),
    };
    writer.finish(&producer, &[]).unwrap();
    let reader = TableReader::open(&dir.path().join("steps"), TableName::Steps).unwrap();
    let mut back: Vec<StepRow> = reader.read_rows().unwrap();
    let mut rows = rows;
    let key = |r: &StepRow| (r.trajectory_id.clone(), r.step_index);
    rows.sort_by_key(key);
    back.sort_by_key(key);
    assert_eq!(back, rows);
    for row in &back {
        let observation = decode(row.observation.as_deref().unwrap()).unwrap();
        observation.expect_shape(&shape()).unwrap();
    }
}

/// A corridor whose observation is a sentence: each episode starts in cell
/// 0 and never ends; actions are Discrete(3) through 4 bins (0 west, 1
/// east, 2 stay), mapped back to their index as the Gymnasium bridge maps
/// them.
struct TextCorridor {
    cells: Vec<u32>,
    texts: Vec<String>,
    bins: ActionBins,
}

impl TextCorridor {
    fn new(n: usize) -> TextCorridor {
        TextCorridor {
            cells: vec![0; n],
            texts: vec![String::new(); n],
            bins: ActionBins::new(4, -1.0, 1.0).unwrap(),
        }
    }
}

fn text_shape() -> ObservationShape {
    ObservationShape {
        height: 0,
        width: 0,
        channels: 3,
        proprio: 0,
    }
}

impl ClosedLoopWorld for TextCorridor {
    fn len(&self) -> usize {
        self.cells.len()
    }
    fn observation_shape(&self) -> ObservationShape {
        text_shape()
    }
    fn image_names(&self) -> &[String] {
        &[]
    }
    fn action_dim(&self) -> usize {
        1
    }
    fn task_id(&self, _: usize) -> &str {
        "corridor"
    }
    fn instruction(&self, _: usize) -> &str {
        "walk"
    }
    fn running(&self, _: usize) -> bool {
        true
    }
    fn observe(&mut self) {
        self.texts = self.cells.iter().map(|c| format!("in cell {c}")).collect();
    }
    fn frames(&self) -> &[u8] {
        &[]
    }
    fn proprio(&self) -> &[f32] {
        &[]
    }
    fn step_chunks(&mut self, actions: &[f32], k: usize) -> Result<Vec<ChunkReport>, WorldError> {
        for (cell, chunk) in self.cells.iter_mut().zip(actions.chunks(k)) {
            for action in self.bins.encode(chunk)? {
                match action.min(2) {
                    0 => *cell = cell.saturating_sub(1),
                    1 => *cell += 1,
                    _ => {}
                }
            }
        }
        let report = ChunkReport {
            env_steps: k as u32,
            done: false,
            success: false,
            failure: None,
        };
        Ok(vec![report; self.cells.len()])
    }
    fn target_ever_grasped(&self, _: usize) -> Option<bool> {
        None
    }
    fn observation_text(&self, i: usize) -> Option<&str> {
        Some(&self.texts[i])
    }
    fn start_failure(&self, _: usize) -> Option<&str> {
        None
    }
}

/// Plays each episode's scripted tokens (one action per decision) and
/// keeps the prompts it read, by episode, as text (byte ids).
struct Script {
    tokens: Vec<Vec<u32>>,
    history: usize,
    read: Vec<Vec<String>>,
}

impl ChunkPolicy for Script {
    type Error = embodyflow_core::Error;

    fn chunk_len(&self) -> usize {
        1
    }

    fn action_dim(&self) -> usize {
        1
    }

    fn observation_shape(&self) -> ObservationShape {
        text_shape()
    }

    fn instruction_ids(&self, instruction: &str) -> Result<Vec<i32>, Self::Error> {
        Ok(byte_ids(instruction))
    }

    fn history(&self) -> usize {
        self.history
    }

    fn decide(&mut self, batch: &DecisionBatch<'_>) -> Result<Vec<ChunkDecision>, Self::Error> {
        Ok(batch
            .episodes
            .iter()
            .zip(batch.instructions)
            .map(|(&i, prompt)| {
                let text = prompt.iter().map(|&b| b as u8 as char).collect();
                self.read[i].push(text);
                ChunkDecision {
                    tokens: vec![self.tokens[i][batch.decision]],
                    token_logprobs: vec![-0.5],
                    thought: None,
                }
            })
            .collect())
    }
}

/// The prompts each episode of the text corridor read under `tokens`, and
/// the episodes (3 decisions each).
fn corridor_prompts(
    tokens: Vec<Vec<u32>>,
    history: usize,
) -> (Vec<Vec<String>>, Vec<ClosedLoopEpisode>) {
    let n = tokens.len();
    let mut world = TextCorridor::new(n);
    let mut policy = Script {
        tokens,
        history,
        read: vec![Vec::new(); n],
    };
    let bins = world.bins.clone();
    let run = run_closed_loop(&mut world, &mut policy, &bins, &seeds(n, 0), &config(3)).unwrap();
    (policy.read, run.episodes)
}

/// Two episodes in the same cell at their third decision, one having gone
/// east and back (actions 1, 0), the other having stayed (2, then the top
/// bin 3, which executes action 2 as the bridge maps it): with a history
/// of 2 their prompts recall different decisions, each the text it saw and
/// the action it took; without one they read the same prompt. The steps
/// rows carry the prompts the policy read.
#[test]
fn a_policy_with_a_history_reads_its_episodes_past_in_each_prompt() {
    let tokens = vec![vec![1, 0, 2], vec![2, 3, 2]];
    let (read, episodes) = corridor_prompts(tokens.clone(), 2);
    assert_eq!(
        read[0],
        [
            "walk\nin cell 0",
            "walk\n[Observation 1: 'in cell 0', Action 1: '1']\nin cell 1",
            "walk\n[Observation 1: 'in cell 0', Action 1: '1']\n\
             [Observation 2: 'in cell 1', Action 2: '0']\nin cell 0",
        ]
    );
    assert_eq!(
        read[1][2],
        "walk\n[Observation 1: 'in cell 0', Action 1: '2']\n\
         [Observation 2: 'in cell 0', Action 2: '2']\nin cell 0"
    );
    assert_ne!(read[0][2], read[1][2]);
    for (episode, prompts) in episodes.iter().zip(&read) {
        let rows = episode.step_rows("t");
        let stored: Vec<Vec<i32>> = rows.into_iter().map(|r| r.prompt_ids).collect();
        let wanted: Vec<Vec<i32>> = prompts.iter().map(|p| byte_ids(p)).collect();
        assert_eq!(stored, wanted);
    }
    // Memoryless, the two read one prompt at their third decision.
    let (read, _) = corridor_prompts(tokens, 0);
    assert_eq!(
        (&*read[0][2], &*read[1][2]),
        ("walk\nin cell 0", "walk\nin cell 0")
    );
    assert_eq!(read[0][1], "walk\nin cell 1");
}
