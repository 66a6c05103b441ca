//! Where every estimator writes: [`AdvantagesOut`] passes record batches or
//! rows to the advantages table's writer unchanged, counts each written row
//! into the run's [`AdvantageStats`] (in output order) and keeps the rows
//! `--heatmaps N` draws (the first N with a non-zero A^S, then the first
//! without, as they are written). [`advantages_batch`] builds a batch of the
//! advantages schema from flat columns, for the estimators that write batches
//! (GRPO, GAE) rather than rows (the step path).
//!
//! ```text
//! estimator ──write_batch / write_rows──► AdvantagesOut ──► TableWriter (advantages)
//!                                              ├─► AdvantageStats (steps, tokens, A^E moments)
//!                                              └─► heatmap rows (first N)
//! ```
//!
//! Steps with holes in their response mask ([`Holes`]) are written with
//! advantage (and return) 0 at the holes, whichever estimator wrote them;
//! a mask of another length than the step's response is bad input.
//!
//! E.g. with `--heatmaps 2`, rows written in the order a (A^S = 0), b
//! (A^S != 0), c (A^S = 0), d (A^S != 0) are drawn as b, d; with only a and c
//! written, as a, c.

use std::sync::Arc;

use arrow::array::{
    Array, ArrayRef, Float32Array, Int32Array, ListArray, RecordBatch, StringArray, new_null_array,
};
use arrow::buffer::OffsetBuffer;
use arrow::datatypes::DataType;
use embodyflow_algos::gae::zero_holes;
use embodyflow_core::Result;
use embodyflow_core::dataset::{TableWriter, batch_to_rows, column};
use embodyflow_core::schemas::{AdvantageRow, TableName};

use crate::diagnostics::AdvantageStats;
use crate::holes::Holes;

/// The advantages table being written, with the statistics of what went in.
pub struct AdvantagesOut {
    writer: TableWriter,
    stats: AdvantageStats,
    heatmaps: HeatmapRows,
    holes: Arc<Holes>,
}

impl AdvantagesOut {
    /// Writes through `writer`, keeping up to `heatmaps` rows to draw and
    /// zeroing the steps' `holes`.
    pub fn new(writer: TableWriter, heatmaps: usize, holes: Arc<Holes>) -> AdvantagesOut {
        AdvantagesOut {
            writer,
            stats: AdvantageStats::default(),
            heatmaps: HeatmapRows::new(heatmaps),
            holes,
        }
    }

    /// Writes a batch of the advantages schema (e.g. from [`advantages_batch`]).
    pub fn write_batch(&mut self, batch: &RecordBatch) -> Result<()> {
        if self.holes.is_empty() {
            return self.write_masked_batch(batch);
        }
        let batch = zero_holes_of_batch(batch, &self.holes)?;
        self.write_masked_batch(&batch)
    }

    /// Writes a batch whose holes are zeroed.
    fn write_masked_batch(&mut self, batch: &RecordBatch) -> Result<()> {
        let episode_adv = column::<Float32Array>(batch, "episode_adv");
        let advantages = column::<ListArray>(batch, "advantages");
        for i in 0..batch.num_rows() {
            self.stats
                .add(episode_adv.value(i), advantages.value_length(i) as usize);
        }
        self.heatmaps.offer_batch(batch)?;
        self.writer.write_batch(batch)
    }

    /// Writes rows.
    pub fn write_rows(&mut self, rows: &[AdvantageRow]) -> Result<()> {
        if !self.holes.is_empty() {
            let mut rows = rows.to_vec();
            for row in &mut rows {
                let tokens = row.advantages.len();
                if let Some(mask) =
                    self.holes
                        .of_step(&row.trajectory_id, row.step_index, tokens)?
                {
                    zero_holes(&mut row.advantages, mask);
                    if let Some(returns) = &mut row.returns {
                        zero_holes(returns, mask);
                    }
                }
            }
            return self.write_masked_rows(&rows);
        }
        self.write_masked_rows(rows)
    }

    /// Writes rows whose holes are zeroed.
    fn write_masked_rows(&mut self, rows: &[AdvantageRow]) -> Result<()> {
        for row in rows {
            self.stats.add(row.episode_adv, row.advantages.len());
            self.heatmaps.offer(row);
        }
        self.writer.write_rows(rows)
    }

    /// The writer (to finish the table), the statistics and the heatmap rows.
    pub fn into_parts(self) -> (TableWriter, AdvantageStats, Vec<AdvantageRow>) {
        (self.writer, self.stats, self.heatmaps.into_rows())
    }
}

/// The first `count` written rows with a non-zero A^S and the first `count`
/// without; the rows drawn are the former, then the latter, `count` in all.
struct HeatmapRows {
    count: usize,
    with_step: Vec<AdvantageRow>,
    without: Vec<AdvantageRow>,
}

impl HeatmapRows {
    fn new(count: usize) -> HeatmapRows {
        HeatmapRows {
            count,
            with_step: Vec::new(),
            without: Vec::new(),
        }
    }

    fn has_step(row: &AdvantageRow) -> bool {
        row.step_adv
            .as_ref()
            .is_some_and(|s| s.iter().any(|&v| v != 0.0))
    }

    fn offer(&mut self, row: &AdvantageRow) {
        let bucket = if Self::has_step(row) {
            &mut self.with_step
        } else {
            &mut self.without
        };
        if bucket.len() < self.count {
            bucket.push(row.clone());
        }
    }

    /// Converts only rows of `batch` that could still be kept: without any
    /// `step_adv` in it (GRPO, GAE), the head that fills the rows without.
    fn offer_batch(&mut self, batch: &RecordBatch) -> Result<()> {
        let step_adv = column::<ListArray>(batch, "step_adv");
        let candidates = if step_adv.null_count() == batch.num_rows() {
            // No row has an A^S: each goes to the rows without.
            self.count - self.without.len()
        } else if self.with_step.len() < self.count || self.without.len() < self.count {
            batch.num_rows()
        } else {
            0
        };
        if candidates == 0 {
            return Ok(());
        }
        let head = batch.slice(0, candidates.min(batch.num_rows()));
        for row in batch_to_rows::<AdvantageRow>(&head)? {
            self.offer(&row);
        }
        Ok(())
    }

    fn into_rows(self) -> Vec<AdvantageRow> {
        let count = self.count;
        self.with_step
            .into_iter()
            .chain(self.without)
            .take(count)
            .collect()
    }
}

/// `batch` with its steps' advantages and returns set to 0 at their holes.
fn zero_holes_of_batch(batch: &RecordBatch, holes: &Holes) -> Result<RecordBatch> {
    let ids = column::<StringArray>(batch, "trajectory_id");
    let index = column::<Int32Array>(batch, "step_index");
    let mut columns = batch.columns().to_vec();
    for name in ["advantages", "returns"] {
        let at = batch.schema().index_of(name).expect("advantages schema");
        let list = column::<ListArray>(batch, name);
        if list.null_count() == list.len() {
            continue;
        }
        let offsets = list.value_offsets();
        let (first, last) = (offsets[0] as usize, offsets[list.len()] as usize);
        let flat = list
            .values()
            .as_any()
            .downcast_ref::<Float32Array>()
            .expect("list<f32>");
        let mut values = flat.values()[first..last].to_vec();
        let mut changed = false;
        for i in 0..batch.num_rows() {
            let range = offsets[i] as usize - first..offsets[i + 1] as usize - first;
            if let Some(mask) = holes.of_step(ids.value(i), index.value(i), range.len())? {
                zero_holes(&mut values[range], mask);
                changed = true;
            }
        }
        if !changed {
            continue;
        }
        let rebased = OffsetBuffer::new(offsets.iter().map(|&o| o - first as i32).collect());
        let item = match list.data_type() {
            DataType::List(item) => item.clone(),
            other => unreachable!("{name} is a list, not {other}"),
        };
        columns[at] = Arc::new(ListArray::new(
            item,
            rebased,
            Arc::new(Float32Array::from(values)),
            list.nulls().cloned(),
        ));
    }
    Ok(RecordBatch::try_new(batch.schema(), columns).expect("the same schema"))
}

/// An advantages record batch from its columns: per-token `advantages` (and
/// `returns`, same offsets) as flat values with list offsets; `step_adv` null.
pub(crate) fn advantages_batch(
    trajectory_ids: ArrayRef,
    step_index: ArrayRef,
    offsets: OffsetBuffer<i32>,
    advantages: Vec<f32>,
    returns: Option<Vec<f32>>,
    episode_adv: Vec<f32>,
    estimator: &str,
) -> RecordBatch {
    let schema = TableName::Advantages.def().arrow_schema();
    let item = match schema
        .field_with_name("advantages")
        .expect("schema column")
        .data_type()
    {
        DataType::List(item) => item.clone(),
        other => unreachable!("advantages is a list, not {other}"),
    };
    let list_type = DataType::List(item.clone());
    let n = episode_adv.len();
    let list = |values: Vec<f32>| -> ArrayRef {
        Arc::new(ListArray::new(
            item.clone(),
            offsets.clone(),
            Arc::new(Float32Array::from(values)),
            None,
        ))
    };
    let columns: Vec<ArrayRef> = vec![
        trajectory_ids,
        step_index,
        list(advantages),
        returns.map_or_else(|| new_null_array(&list_type, n), list),
        Arc::new(Float32Array::from(episode_adv)),
        new_null_array(&list_type, n),
        Arc::new(StringArray::from(vec![estimator; n])),
    ];
    RecordBatch::try_new(schema, columns).expect("columns follow the advantages schema")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(id: &str, step_adv: Option<Vec<f32>>) -> AdvantageRow {
        AdvantageRow {
            trajectory_id: id.into(),
            step_index: 0,
            advantages: vec![0.5; 2],
            returns: None,
            episode_adv: 0.5,
            step_adv,
            estimator: "grpo_step".into(),
        }
    }

    fn ids(rows: &[AdvantageRow]) -> Vec<&str> {
        rows.iter().map(|r| r.trajectory_id.as_str()).collect()
    }

    #[test]
    fn heatmaps_take_rows_with_a_step_advantage_first_in_written_order() {
        let mut kept = HeatmapRows::new(2);
        for r in [
            row("a", Some(vec![0.0, 0.0])),
            row("b", Some(vec![0.0, 1.0])),
            row("c", None),
            row("d", Some(vec![-1.0, 0.0])),
            row("e", Some(vec![1.0, 1.0])),
        ] {
            kept.offer(&r);
        }
        assert_eq!(ids(&kept.into_rows()), ["b", "d"]);
        let mut few = HeatmapRows::new(3);
        for r in [
            row("a", None),
            row("b", Some(vec![2.0, 0.0])),
            row("c", None),
        ] {
            few.offer(&r);
        }
        assert_eq!(ids(&few.into_rows()), ["b", "a", "c"]);
    }

    /// Writes `a` as a batch (advantages and returns) and `b` as rows.
    struct BatchAndRows;

    impl crate::estimator::Estimate for BatchAndRows {
        fn write(
            &self,
            _: &crate::estimator::StepsInput<'_>,
            out: &mut AdvantagesOut,
        ) -> Result<crate::estimator::Reported> {
            out.write_batch(&advantages_batch(
                Arc::new(StringArray::from(vec!["a", "a"])),
                Arc::new(Int32Array::from(vec![0, 1])),
                OffsetBuffer::from_lengths(vec![3, 2]),
                vec![1.0, 2.0, 3.0, 4.0, 5.0],
                Some(vec![0.5; 5]),
                vec![2.0, 4.5],
                "gae",
            ))?;
            out.write_rows(&[AdvantageRow {
                returns: Some(vec![0.5; 2]),
                ..row("b", Some(vec![1.0, 1.0]))
            }])?;
            Ok(None)
        }
    }

    #[test]
    fn holes_are_written_zero_from_batches_and_rows_and_checked() {
        use crate::testdata::{Fixture, step};
        let masked = |id, index, tokens, mask: &[bool]| {
            let mut row = step(id, index, tokens);
            row.response_mask = Some(mask.to_vec());
            row
        };
        let f = Fixture::new(
            &[("a", "g", 1.0, 2), ("b", "g", 0.0, 1)],
            &[
                masked("a", 0, 3, &[false, true, false]),
                step("a", 1, 2),
                masked("b", 0, 2, &[true, false]),
            ],
        );
        let (rows, ..) = f.run(&BatchAndRows, &f.all_groups(), 8).unwrap();
        let got: Vec<(&str, &[f32], &[f32])> = rows
            .iter()
            .map(|r| {
                let returns = r.returns.as_deref().unwrap();
                (r.trajectory_id.as_str(), r.advantages.as_slice(), returns)
            })
            .collect();
        assert_eq!(
            got,
            [
                ("a", &[0.0, 2.0, 0.0][..], &[0.0, 0.5, 0.0][..]),
                ("a", &[4.0, 5.0][..], &[0.5, 0.5][..]),
                ("b", &[0.5, 0.0][..], &[0.5, 0.0][..]),
            ]
        );
        // A mask of another length than the written step's tokens.
        let f = Fixture::new(
            &[("a", "g", 1.0, 2), ("b", "g", 0.0, 1)],
            &[
                step("a", 0, 3),
                step("a", 1, 2),
                masked("b", 0, 3, &[true; 3]),
            ],
        );
        let error = f
            .run(&BatchAndRows, &f.all_groups(), 8)
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("trajectory `b` step 0: response_mask has 3 entries, expected 2"),
            "{error}"
        );
    }

    #[test]
    fn heatmaps_of_batches_keep_the_first_rows_written() {
        let batch = |ids: Vec<&str>| {
            let n = ids.len();
            advantages_batch(
                Arc::new(StringArray::from(ids)),
                Arc::new(Int32Array::from(vec![0; n])),
                OffsetBuffer::from_lengths(vec![1; n]),
                vec![0.25; n],
                None,
                vec![0.25; n],
                "grpo",
            )
        };
        let mut kept = HeatmapRows::new(3);
        kept.offer_batch(&batch(vec!["a", "b"])).unwrap();
        kept.offer_batch(&batch(vec!["c", "d", "e"])).unwrap();
        assert_eq!(kept.without.len(), 3);
        kept.offer_batch(&batch(vec!["f"])).unwrap();
        let rows = kept.into_rows();
        assert_eq!(ids(&rows), ["a", "b", "c"]);
        assert_eq!(rows[0].advantages, [0.25]);
        assert!(rows[0].step_adv.is_none());
    }
}
