//! Integration tests: binaries run as a user runs them.

mod bad_shards;
mod compute_advantages;
mod killed_writer;
mod score_rewards;
