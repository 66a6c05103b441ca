//! Executor throughput: expert plans of many tasks executed repeatedly on one
//! core; prints `executor_plan_steps_per_s <number>`.
use std::hint::black_box;
use std::time::Instant;

use embodyflow_household::{Split, execute_ids, expert_plan, generate_tasks};

fn main() {
    let tasks = generate_tasks(Split::Train, 11, 2000);
    let plans: Vec<Vec<i32>> = tasks.iter().map(expert_plan).collect();
    let steps_per_pass: usize = plans.iter().map(Vec::len).sum();
    let mut passes = 0usize;
    let mut successes = 0usize;
    let start = Instant::now();
    while start.elapsed().as_secs_f64() < 2.0 {
        for (task, plan) in tasks.iter().zip(&plans) {
            successes +=
                usize::from(black_box(execute_ids(black_box(task), black_box(plan))).success);
        }
        passes += 1;
    }
    let secs = start.elapsed().as_secs_f64();
    assert_eq!(
        successes,
        passes * tasks.len(),
        "every expert plan succeeds"
    );
    let rate = (passes * steps_per_pass) as f64 / secs;
    println!("executor_plan_steps_per_s {rate:.0}");
    eprintln!(
        "({passes} passes over {} tasks, {steps_per_pass} plan steps per pass, {secs:.2} s)",
        tasks.len()
    );
}
