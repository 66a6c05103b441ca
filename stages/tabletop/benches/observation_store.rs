//! Serving a closed-loop update's observations epoch after epoch
//! (`update-policy`): the per-epoch cost of getting every observation of a
//! steps table once, in a fresh shuffled order, three ways:
//!
//! - (a) re-reading the Parquet steps table with the project's reader
//!   (`TableReader`, shard hashes checked as in a stage): only the
//!   `observation` column (the best case for Parquet), and whole
//!   [`StepRow`]s as `read_rows` gives them;
//! - (b) holding every observation in memory (`Vec<Vec<u8>>`, read once);
//! - (c) the memory-mapped Arrow IPC [`ObservationStore`] (a sealed memory
//!   file), written once; its first epoch right after writing (fresh
//!   mapping), then warm epochs.
//!
//! The steps table holds `DECISIONS` decisions of expert demonstrations
//! (noise 0.3; grasps, pushes, retries) over the four suites, observed at 32
//! and at 48 pixels, K = 8 action tokens per dimension through OpenVLA's
//! bins, written with the project's `TableWriter` (zstd Parquet). Getting an
//! observation means decoding it (`observation::decode`: header checks,
//! proprio) and copying its pixels into a scratch buffer, as building an
//! input batch does; that cost is common to every way.
//!
//! The ways take turns: each round runs one epoch of every way over the same
//! fresh order, so a busy machine slows them alike; each time is the median
//! (and best) of `ROUNDS` timed rounds after one warm-up round, all in the
//! same process and run (the first epochs of the store after writing and
//! after eviction are single measurements). Memory is measured in a fresh
//! child process per way (this binary with `--memory`), from
//! `/proc/self/status`: what each way holds after one epoch over the
//! baseline (anonymous memory, the process's own; shared memory, the
//! store's mapped pages) and the peak over the baseline
//! (`VmHWM`, reset through `/proc/self/clear_refs`). Printed as `name value`
//! lines.
use std::hint::black_box;
use std::path::Path;
use std::time::Instant;

use arrow::array::{Array, AsArray, BinaryArray};
use embodyflow_algos::action_tokens::ActionBins;
use embodyflow_core::dataset::{TableReader, TableWriter, WriteOptions};
use embodyflow_core::manifest::Producer;
use embodyflow_core::observation::{ObservationShape, decode, encode};
use embodyflow_core::observation_store::{ObservationStore, ObservationStoreWriter};
use embodyflow_core::schemas::{StepRow, TableName};
use embodyflow_tabletop::{
    ExpertConfig, Labels, PROPRIO_DIM, Split, Strategy, Suite, demonstration, generate,
};
use rand::SeedableRng;
use rand::seq::SliceRandom;
use rand_chacha::ChaCha8Rng;

const DECISIONS: usize = 20_000;
const K: usize = 8;
const ROUNDS: usize = 9;
const SIZES: [usize; 2] = [32, 48];

/// The steps rows of expert demonstrations until `DECISIONS` decisions,
/// observed at `size` pixels.
fn step_rows(size: usize) -> Vec<StepRow> {
    let bins = ActionBins::openvla();
    let shape = ObservationShape {
        height: size,
        width: size,
        channels: 3,
        proprio: PROPRIO_DIM,
    };
    let mut rows = Vec::with_capacity(DECISIONS);
    for (i, suite) in Suite::ALL.iter().cycle().enumerate() {
        if rows.len() >= DECISIONS {
            break;
        }
        let task = generate(*suite, Split::Train, 3, i as u64);
        let config = ExpertConfig {
            noise: 0.3,
            seed: i as u64,
        };
        let Ok(demo) = demonstration(&task, Strategy::Grasp, config, Labels::Executed, K, size)
        else {
            continue;
        };
        // A word-level stand-in for the instruction's BPE ids.
        let prompt_ids: Vec<i32> = task
            .instruction
            .split_whitespace()
            .map(|w| w.bytes().map(i32::from).sum::<i32>() % 400)
            .collect();
        for (index, decision) in demo.decisions.iter().enumerate() {
            let actions: Vec<f32> = decision.actions.iter().flatten().copied().collect();
            let tokens = bins.encode(&actions).expect("expert actions are in range");
            let mut row = StepRow::one_shot(
                format!("it0/{i:06}/d0/s0"),
                prompt_ids.clone(),
                tokens.iter().map(|&t| t as i32).collect(),
                tokens
                    .iter()
                    .map(|&t| -5.0 - (t * 37 % 101) as f32 / 100.0)
                    .collect(),
            );
            row.step_index = index as i32;
            row.observation =
                Some(encode(&shape, &decision.frame, &decision.proprio).expect("a rendered frame"));
            rows.push(row);
        }
    }
    rows.truncate(DECISIONS);
    rows
}

fn write_table(out: &Path, rows: &[StepRow]) {
    let producer = Producer {
        stage: "bench".into(),
        version: "0".into(),
        config: serde_json::json!({}),
        seed: 0,
        shard: "0/1".into(),
    };
    let mut writer = TableWriter::create(out, TableName::Steps, WriteOptions::default(), false)
        .expect("a new table");
    for chunk in rows.chunks(4096) {
        writer.write_rows(chunk).expect("valid rows");
    }
    writer.finish(&producer, &[]).expect("the table commits");
}

/// Gets one observation: decodes it and copies its pixels into `pixels`.
fn consume(bytes: &[u8], pixels: &mut Vec<u8>) -> u64 {
    let observation = decode(bytes).expect("the bench's observations decode");
    pixels.clear();
    pixels.extend_from_slice(observation.pixels);
    u64::from(pixels[pixels.len() / 2]) + observation.proprio.len() as u64
}

/// Epoch `epoch`'s order of `n` rows.
fn shuffled(n: usize, epoch: u64) -> Vec<usize> {
    let mut order: Vec<usize> = (0..n).collect();
    order.shuffle(&mut ChaCha8Rng::seed_from_u64(epoch));
    order
}

/// The `observation` column of the steps table, batch by batch.
fn observation_column(table: &Path) -> Vec<BinaryArray> {
    let reader = TableReader::open(table, TableName::Steps).expect("the bench table");
    reader
        .batches(Some(&["observation"]), 8192)
        .expect("the column exists")
        .map(|batch| {
            batch
                .expect("a valid shard")
                .column(0)
                .as_binary::<i32>()
                .clone()
        })
        .collect()
}

/// (a) One epoch from Parquet, the observation column only.
fn parquet_column_epoch(table: &Path, order: &[usize], pixels: &mut Vec<u8>) -> u64 {
    let batches = observation_column(table);
    let mut starts = Vec::with_capacity(batches.len());
    let mut n = 0;
    for batch in &batches {
        starts.push(n);
        n += batch.len();
    }
    order
        .iter()
        .map(|&i| {
            let b = starts.partition_point(|&s| s <= i) - 1;
            consume(batches[b].value(i - starts[b]), pixels)
        })
        .sum()
}

/// (a) One epoch from Parquet, whole rows.
fn parquet_rows_epoch(table: &Path, order: &[usize], pixels: &mut Vec<u8>) -> u64 {
    let rows: Vec<StepRow> = TableReader::open(table, TableName::Steps)
        .and_then(|r| r.read_rows())
        .expect("the bench table");
    order
        .iter()
        .map(|&i| {
            consume(
                rows[i].observation.as_deref().expect("closed-loop rows"),
                pixels,
            )
        })
        .sum()
}

fn memory_epoch(held: &[Vec<u8>], order: &[usize], pixels: &mut Vec<u8>) -> u64 {
    order.iter().map(|&i| consume(&held[i], pixels)).sum()
}

fn store_epoch(store: &ObservationStore, order: &[usize], pixels: &mut Vec<u8>) -> u64 {
    order.iter().map(|&i| consume(store.get(i), pixels)).sum()
}

/// Seconds of one call.
fn seconds(f: impl FnOnce() -> u64) -> f64 {
    let start = Instant::now();
    black_box(f());
    start.elapsed().as_secs_f64()
}

/// One way of serving an epoch over an order of the rows.
type Way<'a> = Box<dyn FnMut(&[usize]) -> u64 + 'a>;

/// (median, best) seconds per epoch of each way, over `ROUNDS` rounds after
/// a warm-up round; in a round every way runs one epoch of the same order.
fn rounds(n: usize, ways: &mut [Way<'_>]) -> Vec<(f64, f64)> {
    let mut times = vec![Vec::new(); ways.len()];
    for round in 0..=ROUNDS as u64 {
        let order = shuffled(n, round);
        for (way, time) in ways.iter_mut().zip(&mut times) {
            let t = seconds(|| way(&order));
            if round > 0 {
                time.push(t);
            }
        }
    }
    times
        .into_iter()
        .map(|mut t| {
            t.sort_by(f64::total_cmp);
            (t[ROUNDS / 2], t[0])
        })
        .collect()
}

fn report(prefix: &str, name: &str, (median, best): (f64, f64), n: usize) {
    println!("{prefix}_{name}_epoch_ms {:.1}", median * 1e3);
    println!("{prefix}_{name}_epoch_best_ms {:.1}", best * 1e3);
    println!("{prefix}_{name}_obs_per_s {:.0}", n as f64 / median);
}

/// Drops the file's clean pages from the page cache.
/// `/proc/self/status` fields in KiB: VmRSS, RssAnon, RssShmem, VmHWM.
fn status() -> [i64; 4] {
    let text = std::fs::read_to_string("/proc/self/status").expect("Linux");
    ["VmRSS:", "RssAnon:", "RssShmem:", "VmHWM:"].map(|key| {
        text.lines()
            .find_map(|line| line.strip_prefix(key))
            .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or(-1)
    })
}

/// Child mode: one way's memory over one epoch of `table`, as `name value`
/// lines (MiB).
fn memory(way: &str, table: &Path) {
    let mut pixels = Vec::new();
    // The reader's code and buffers are paged in before the baseline.
    black_box(observation_column(table).len());
    let n = TableReader::open(table, TableName::Steps)
        .expect("the bench table")
        .num_rows() as usize;
    let order = shuffled(n, 1);
    std::fs::write("/proc/self/clear_refs", "5").expect("resetting VmHWM");
    let [rss, anon, shmem, _] = status();
    let mut keep: (Vec<Vec<u8>>, Option<ObservationStore>) = (Vec::new(), None);
    match way {
        "parquet" => {
            black_box(parquet_column_epoch(table, &order, &mut pixels));
        }
        "memory" => {
            keep.0 = observation_column(table)
                .iter()
                .flat_map(|b| {
                    b.iter()
                        .map(|v| v.expect("non-null").to_vec())
                        .collect::<Vec<_>>()
                })
                .collect();
            black_box(memory_epoch(&keep.0, &order, &mut pixels));
        }
        "mmap" => {
            let mut writer = ObservationStoreWriter::create().expect("a memory file");
            for batch in observation_column(table) {
                for value in batch.iter() {
                    writer.push(value.expect("non-null")).expect("written");
                }
            }
            let store = writer.finish().expect("the store");
            black_box(store_epoch(&store, &order, &mut pixels));
            keep.1 = Some(store);
        }
        other => panic!("unknown way {other}"),
    }
    let [rss2, anon2, shmem2, hwm] = status();
    let mib = |kib: i64| kib as f64 / 1024.0;
    println!("{way}_held_anon_mib {:.1}", mib(anon2 - anon));
    println!("{way}_held_shmem_mib {:.1}", mib(shmem2 - shmem));
    println!("{way}_held_rss_mib {:.1}", mib(rss2 - rss));
    println!("{way}_peak_rss_mib {:.1}", mib(hwm - rss));
    black_box(&keep);
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(at) = args.iter().position(|a| a == "--memory") {
        memory(&args[at + 1], Path::new(&args[at + 2]));
        return;
    }
    println!("observation_store_decisions {DECISIONS}");
    for size in SIZES {
        let prefix = format!("obs{size}");
        let dir = tempfile::tempdir().expect("a scratch directory");
        let rows = step_rows(size);
        let n = rows.len();
        let obs_bytes: usize = rows
            .iter()
            .map(|r| r.observation.as_ref().map_or(0, Vec::len))
            .sum();
        write_table(dir.path(), &rows);
        let table = dir.path().join("steps");
        let parquet_bytes: u64 = TableReader::open(&table, TableName::Steps)
            .expect("the bench table")
            .manifest()
            .shards
            .iter()
            .map(|s| s.bytes)
            .sum();
        println!("{prefix}_observation_bytes {}", obs_bytes / n);
        println!(
            "{prefix}_observations_mib {:.1}",
            obs_bytes as f64 / (1 << 20) as f64
        );
        println!(
            "{prefix}_parquet_table_mib {:.1}",
            parquet_bytes as f64 / (1 << 20) as f64
        );
        let mut pixels = Vec::new();
        let held: Vec<Vec<u8>> = rows.into_iter().filter_map(|r| r.observation).collect();
        let start = Instant::now();
        let store = ObservationStore::write(&held).expect("the store");
        let write = start.elapsed().as_secs_f64();
        println!("{prefix}_mmap_write_ms {:.1}", write * 1e3);
        println!(
            "{prefix}_mmap_file_mib {:.1}",
            store.file_bytes() as f64 / (1 << 20) as f64
        );
        let cold = seconds(|| store_epoch(&store, &shuffled(n, 100), &mut pixels));
        println!("{prefix}_mmap_cold_epoch_ms {:.1}", cold * 1e3);

        let names = ["parquet_column", "parquet_rows", "memory", "mmap_warm"];
        let (table, held_ref, store_ref) = (&table, &held, &store);
        let mut buffers = [Vec::new(), Vec::new(), Vec::new(), Vec::new()];
        let [p0, p1, p2, p3] = &mut buffers;
        let mut ways: [Way<'_>; 4] = [
            Box::new(|order| parquet_column_epoch(table, order, p0)),
            Box::new(|order| parquet_rows_epoch(table, order, p1)),
            Box::new(|order| memory_epoch(held_ref, order, p2)),
            Box::new(|order| store_epoch(store_ref, order, p3)),
        ];
        let times = rounds(n, &mut ways);
        drop(ways);
        for (name, time) in names.iter().zip(&times) {
            report(&prefix, name, *time, n);
        }
        let (a, b, c) = (times[0], times[2], times[3]);
        drop(store);
        drop(held);
        println!("{prefix}_mmap_vs_parquet_column {:.1}x", a.0 / c.0);
        println!("{prefix}_mmap_vs_memory {:.2}x", b.0 / c.0);

        let exe = std::env::current_exe().expect("this bench");
        for way in ["parquet", "memory", "mmap"] {
            let out = std::process::Command::new(&exe)
                .arg("--memory")
                .arg(way)
                .arg(&table)
                .output()
                .expect("the memory child runs");
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            for line in String::from_utf8_lossy(&out.stdout).lines() {
                println!("{prefix}_{line}");
            }
        }
    }
}
