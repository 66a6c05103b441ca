//! Integration tests: binaries run as a user runs them.

mod bad_config;
mod bad_shards;
mod closed_loop_learning;
mod closed_loop_rollouts;
mod commit;
mod compute_advantages;
mod examples;
mod foreign_rollouts;
mod gigpo;
mod grpo_step;
mod gym_stages;
mod hf_policy;
mod killed_writer;
mod lapo_inputs;
mod learning_loop;
mod progress_logs;
mod runner;
mod score_rewards;
mod sharding;
mod slurm;
mod stage_spec;
mod tabletop_eval;
mod tabletop_tasks;
mod threads;
mod tools_open_tables;
mod vla_update;
