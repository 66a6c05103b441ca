//! `World::state_bytes`: equal exactly when two worlds are in the same state.

use crate::suite::{Split, Suite, generate};

use super::{Grip, Support, World};

#[test]
fn copies_of_a_task_share_their_state_until_their_actions_differ() {
    let task = generate(Suite::Goal, Split::Train, 7, 3);
    let (mut a, mut b) = (World::new(&task).unwrap(), World::new(&task).unwrap());
    assert_eq!(a.state_bytes(), b.state_bytes());
    let other = World::new(&generate(Suite::Goal, Split::Train, 7, 4)).unwrap();
    assert_ne!(a.state_bytes(), other.state_bytes());
    // The same action: still equal (and equal to a clone).
    a.step(&[0.5, -0.25, 0.0, 0.0]).unwrap();
    b.step(&[0.5, -0.25, 0.0, 0.0]).unwrap();
    assert_eq!(a.state_bytes(), b.state_bytes());
    assert_eq!(a.clone().state_bytes(), a.state_bytes());
    // Different actions part them.
    a.step(&[0.1, 0.0, 0.0, 0.0]).unwrap();
    b.step(&[0.2, 0.0, 0.0, 0.0]).unwrap();
    assert_ne!(a.state_bytes(), b.state_bytes());
}

#[test]
fn every_field_counts() {
    let world = World::new(&generate(Suite::Goal, Split::Train, 7, 3)).unwrap();
    let base = world.state_bytes();
    let mut changed = world.clone();
    changed.steps += 1;
    assert_ne!(changed.state_bytes(), base, "step count");
    let mut changed = world.clone();
    changed.gripper.grip = Grip::Closed;
    assert_ne!(changed.state_bytes(), base, "grip");
    let mut changed = world.clone();
    changed.bodies[0].pos[0] = f32::from_bits(changed.bodies[0].pos[0].to_bits() + 1);
    assert_ne!(changed.state_bytes(), base, "one ulp of a position");
    let mut changed = world.clone();
    changed.grasped |= 1;
    assert_ne!(changed.state_bytes(), base, "grasp history");
    let mut changed = world.clone();
    changed.bodies[0].support = Support::Held;
    assert_ne!(changed.state_bytes(), base, "support");
}
