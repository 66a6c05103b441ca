//! What the queue cost per step ([`queue_figures`]): submission to start,
//! and end of the jobs waited for to start, from the submission times in
//! the journal and the start and end times every task records on its node.

use std::collections::BTreeMap;
use std::path::Path;

use super::journal::{JobEntry, TaskRecord, backend_dir, read_task};

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    let n = values.len();
    if n % 2 == 1 {
        values[n / 2]
    } else {
        (values[n / 2 - 1] + values[n / 2]) / 2.0
    }
}

/// What the queue cost this submission (`ids`), from the jobs' submission
/// times and the task records: from submission to start, and from the end
/// of the last job a job waited for to its start. With `when_ready` (the
/// runner submits a job once what it waits for has ended, Ray) the first
/// covers every job and the second includes the runner's own wait and
/// submission; otherwise (Slurm, every job submitted at once) the first
/// covers the jobs that waited for nothing. `None` when no job started.
pub fn queue_figures(
    out: &Path,
    backend: &str,
    entries: &[JobEntry],
    ids: &[String],
    when_ready: bool,
) -> Option<String> {
    let by_id: BTreeMap<&str, &JobEntry> = entries
        .iter()
        .filter(|e| ids.contains(&e.job))
        .map(|e| (e.job.as_str(), e))
        .collect();
    // Start and end of every task of a job.
    let tasks = |entry: &JobEntry| -> Vec<TaskRecord> {
        let dir = backend_dir(out, backend).join(&entry.instance);
        if entry.kind == "merge" {
            read_task(&dir.join("merge.json")).into_iter().collect()
        } else {
            (entry.first..entry.first + entry.tasks)
                .filter_map(|i| read_task(&dir.join(format!("task-{i}.json"))))
                .collect()
        }
    };
    let mut to_start = Vec::new();
    let mut after_end = Vec::new();
    for entry in by_id.values() {
        let starts: Vec<f64> = tasks(entry).iter().map(|t| t.started_unix).collect();
        if entry.after.is_empty() || when_ready {
            to_start.extend(starts.iter().map(|s| s - entry.submitted_unix));
        }
        if entry.after.is_empty() {
            continue;
        }
        let ends: Option<Vec<f64>> = entry
            .after
            .iter()
            .map(|dep| {
                let dep = by_id.get(dep.as_str())?;
                let ends: Vec<f64> = tasks(dep).iter().filter_map(|t| t.ended_unix).collect();
                (ends.len() as u32 == dep.tasks).then(|| ends.into_iter().fold(f64::MIN, f64::max))
            })
            .collect();
        if let Some(ends) = ends {
            let from = if when_ready {
                f64::MIN
            } else {
                entry.submitted_unix
            };
            let ready = ends.into_iter().fold(from, f64::max);
            after_end.extend(starts.iter().map(|s| s - ready));
        }
    }
    if to_start.is_empty() && after_end.is_empty() {
        return None;
    }
    let describe = |what: &str, values: &mut Vec<f64>| {
        if values.is_empty() {
            return format!("{what}: none");
        }
        let (lo, hi) = (
            values.iter().copied().fold(f64::MAX, f64::min),
            values.iter().copied().fold(f64::MIN, f64::max),
        );
        format!(
            "{what}: median {:.2} s over {} task(s) ({lo:.2} to {hi:.2} s)",
            median(values),
            values.len()
        )
    };
    Some(format!(
        "{backend} queue: {}; {}",
        describe("submission to start", &mut to_start),
        describe("end of the jobs waited for to start", &mut after_end)
    ))
}
