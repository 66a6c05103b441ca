//! GiGPO's anchor keys of the tabletop world (`TabletopEpisodes::anchor_key`,
//! a BLAKE3 of `World::state_bytes`): the G copies of a task share the key at
//! decision 0, copies that took different actions part, and copies that
//! took the same actions keep sharing it.

use embodyflow_tabletop::{ACTION_DIM, Split, Suite, TabletopEpisodes, generate};
use embodyflow_world::ClosedLoopWorld;

#[test]
fn copies_share_the_key_until_their_actions_differ() {
    let tasks = [
        generate(Suite::Goal, Split::Train, 3, 0),
        generate(Suite::Goal, Split::Train, 3, 1),
    ];
    // Episodes 0..3 copy task 0, 3..6 task 1.
    let mut world = TabletopEpisodes::new(&tasks, 3, 32).unwrap();
    world.observe();
    let keys: Vec<String> = (0..6).map(|i| world.anchor_key(i).unwrap()).collect();
    assert_eq!(keys[0].len(), 32);
    assert!(keys[0].bytes().all(|b| b.is_ascii_hexdigit()));
    assert!(keys[..3].iter().all(|k| *k == keys[0]), "{keys:?}");
    assert!(keys[3..].iter().all(|k| *k == keys[3]), "{keys:?}");
    assert_ne!(keys[0], keys[3]);

    // Copies 0 and 1 of each task move alike; copy 2 moves elsewhere.
    let k = 2;
    let mut actions = Vec::new();
    for episode in 0..6 {
        let dx = if episode % 3 == 2 { -0.5 } else { 0.5 };
        for _ in 0..k {
            actions.extend_from_slice(&[dx, 0.25, 0.0, 0.0][..ACTION_DIM]);
        }
    }
    world.step_chunks(&actions, k).unwrap();
    world.observe();
    let after: Vec<String> = (0..6).map(|i| world.anchor_key(i).unwrap()).collect();
    assert_eq!(after[0], after[1]);
    assert_ne!(after[0], after[2]);
    assert_eq!(after[3], after[4]);
    assert_ne!(after[3], after[5]);
    assert!(
        after.iter().all(|k| !keys.contains(k)),
        "every state moved on"
    );
}
