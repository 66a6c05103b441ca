//! Generalised advantage estimation (Schulman et al. 2016) and veRL's masked
//! whitening.
//!
//! Over the positions t of one sequence, with V after the last position = 0:
//!
//! ```text
//! delta_t = r_t + gamma * V_{t+1} - V_t
//! A_t     = delta_t + gamma * lambda * A_{t+1}
//! returns = A + V                     (before whitening)
//! A      <- (A - mean) * rsqrt(var + 1e-8)   over every position of the batch
//! ```
//!
//! **Token level** ([`gae_tokens`]) is veRL's `compute_gae_advantage_return`
//! (`verl/trainer/ppo/core_algos.py`) on rows without masked positions: one
//! row per trajectory (its steps' response tokens in order), the outcome reward
//! on the last token. **Decision level** (LaST-R1) is the same [`gae_tokens`]
//! over one position per decision step: one value per step, the outcome reward
//! on the last step; each step's advantage is then broadcast to its response
//! tokens by the caller.
//! **Masks with holes** ([`gae_tokens_masked_into`], [`WhitenStats::add_masked`],
//! [`zero_holes`]): a position whose mask is false (a token a tool or the
//! environment inserted into a multi-turn response) is skipped as current
//! veRL skips it: its reward and value are ignored, and the position before
//! it takes `V_{t+1}` and `A_{t+1}` from the next valid position
//! (`nextvalues` and `lastgaelam` carried across). That is plain GAE on the
//! valid positions alone, scattered back; holes get advantage and return 0
//! (veRL leaves the carried values there, which its losses then mask out),
//! and whitening takes its statistics from the valid positions only.
//! E.g. r = [0, 9, 1], V = [0.5, 7, 0.25], mask = [1, 0, 1], gamma = lambda
//! = 1: A = [0.5, 0, 0.75], as the row [0, 1] / [0.5, 0.25] without the hole
//! (the example below).
//!
//! **REINFORCE++** (veRL's `compute_reinforce_plus_plus_outcome_advantage`)
//! is token-level GAE without a critic, V = 0 and lambda = 1: `A_t = r_t +
//! gamma A_{t+1}` over the valid positions (veRL carries its running return
//! across a hole as its GAE carries `lastgaelam`), returns = A, whitened the
//! same way.
//!
//! [`whiten`] is veRL's `masked_whiten` with every position valid: the mean
//! divides by `n + 1e-8`, the variance is the unbiased masked variance, and
//! fewer than two positions is an error rather than a NaN.
//!
//! Whitening a batch too large to hold goes through [`WhitenStats`]: a first
//! pass adds every row's advantages (each piece reduced in f64 with two passes
//! over it, pieces merged with Chan et al.'s update: no sum of squares about
//! zero), then [`WhitenStats::whitening`] gives veRL's affine map, which a
//! second pass applies row by row; [`whiten`] is the same on one slice.
//!
//! ```
//! use embodyflow_algos::gae::{gae_tokens, whiten, GaeParams, WhitenStats};
//! // One row of two tokens, reward 1 on the last, values 0.5 and 0.25.
//! let (adv, ret) = gae_tokens(&[0.0, 1.0], &[0.5, 0.25], &[0, 2], GaeParams { gamma: 1.0, lam: 1.0 });
//! assert_eq!(adv, vec![0.5, 0.75]); // A_1 = 1 - 0.25; A_0 = 0.25 - 0.5 + 0.75
//! assert_eq!(ret, vec![1.0, 1.0]);
//!
//! // Whitening streamed row by row equals whitening the whole batch.
//! let rows = [vec![1.0f32, 2.0], vec![3.0, 4.0, 5.0]];
//! let mut stats = WhitenStats::default();
//! rows.iter().for_each(|row| stats.add(row));
//! let whitening = stats.whitening().unwrap(); // mean 3, unbiased var 2.5
//! let mut streamed: Vec<f32> = rows.concat();
//! whitening.apply(&mut streamed);
//! let mut whole = rows.concat();
//! whiten(&mut whole).unwrap();
//! assert_eq!(streamed, whole);
//! assert!((whole[0] + 2.0 / 2.5f32.sqrt()).abs() < 1e-6);
//! ```

use crate::AlgoError;

/// Discount and GAE lambda.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GaeParams {
    /// Discount gamma.
    pub gamma: f32,
    /// GAE lambda.
    pub lam: f32,
}

impl Default for GaeParams {
    fn default() -> Self {
        GaeParams {
            gamma: 0.99,
            lam: 0.95,
        }
    }
}

/// GAE over ragged rows: row r spans `offsets[r]..offsets[r + 1]` of
/// `rewards` and `values`. Returns (advantages, returns), both unwhitened.
pub fn gae_tokens(
    rewards: &[f32],
    values: &[f32],
    offsets: &[usize],
    params: GaeParams,
) -> (Vec<f32>, Vec<f32>) {
    let (mut advantages, mut returns) = (Vec::new(), Vec::new());
    gae_tokens_into(
        rewards,
        values,
        offsets,
        params,
        &mut advantages,
        &mut returns,
    );
    (advantages, returns)
}

/// [`gae_tokens`], appending the advantages and returns to the given
/// vectors (a caller that streams batches reuses or grows its buffers
/// instead of allocating two per batch).
pub fn gae_tokens_into(
    rewards: &[f32],
    values: &[f32],
    offsets: &[usize],
    params: GaeParams,
    advantages: &mut Vec<f32>,
    returns: &mut Vec<f32>,
) {
    assert_eq!(rewards.len(), values.len(), "one value per reward");
    assert_eq!(
        offsets.last().copied().unwrap_or(0),
        rewards.len(),
        "offsets cover the rows"
    );
    assert!(
        offsets.windows(2).all(|w| w[0] <= w[1]),
        "offsets are non-decreasing"
    );
    let gamma = params.gamma;
    let start = advantages.len();
    advantages.reserve(rewards.len());
    // Pass 1 (vectorisable): TD errors, with V after a row's last position = 0.
    for row in offsets.windows(2) {
        let (r, v) = (&rewards[row[0]..row[1]], &values[row[0]..row[1]]);
        let Some(last) = r.len().checked_sub(1) else {
            continue;
        };
        advantages.extend(
            r[..last]
                .iter()
                .zip(&v[1..])
                .zip(&v[..last])
                .map(|((&r, &next), &v)| r + gamma * next - v),
        );
        advantages.push(r[last] - v[last]);
    }
    let new = &mut advantages[start..];
    // Pass 2: the serial part, A_t = delta_t + gamma * lambda * A_{t+1}.
    discounted_suffix_sums(new, offsets, gamma * params.lam);
    // Pass 3 (vectorisable): returns = A + V.
    returns.extend(new.iter().zip(values).map(|(a, v)| a + v));
}

/// [`gae_tokens_into`] with a mask: positions whose `mask` is false are holes,
/// skipped as veRL's `compute_gae_advantage_return` skips them (`nextvalues`
/// and `lastgaelam` carried across; their rewards and values unused), and
/// given advantage and return 0. Equal to GAE over each row's valid
/// positions alone.
pub fn gae_tokens_masked_into(
    rewards: &[f32],
    values: &[f32],
    mask: &[bool],
    offsets: &[usize],
    params: GaeParams,
    advantages: &mut Vec<f32>,
    returns: &mut Vec<f32>,
) {
    assert_eq!(rewards.len(), values.len(), "one value per reward");
    assert_eq!(rewards.len(), mask.len(), "one mask entry per reward");
    assert_eq!(
        offsets.last().copied().unwrap_or(0),
        rewards.len(),
        "offsets cover the rows"
    );
    let start = advantages.len();
    advantages.resize(start + rewards.len(), 0.0);
    returns.resize(start + rewards.len(), 0.0);
    let (adv, ret) = (&mut advantages[start..], &mut returns[start..]);
    let decay = params.gamma * params.lam;
    for row in offsets.windows(2) {
        let (mut next_value, mut running) = (0f32, 0f32);
        for t in (row[0]..row[1]).rev() {
            if !mask[t] {
                continue;
            }
            let delta = rewards[t] + params.gamma * next_value - values[t];
            running = delta + decay * running;
            next_value = values[t];
            adv[t] = running;
            ret[t] = running + values[t];
        }
    }
}

/// Sets `values` to 0 where `mask` is false (veRL multiplies by the
/// response mask).
pub fn zero_holes(values: &mut [f32], mask: &[bool]) {
    assert_eq!(values.len(), mask.len(), "one mask entry per value");
    for (v, &keep) in values.iter_mut().zip(mask) {
        if !keep {
            *v = 0.0;
        }
    }
}

/// In place, per row: `x_t <- x_t + decay * x_{t+1}` from the row's end. The
/// recurrence is a chain of dependent multiply-adds, so four rows run side by
/// side over their common tail to give the processor independent chains.
fn discounted_suffix_sums(x: &mut [f32], offsets: &[usize], decay: f32) {
    let scan = |row: &mut [f32], mut running: f32| {
        for v in row.iter_mut().rev() {
            running = *v + decay * running;
            *v = running;
        }
    };
    let mut rest = x;
    let lengths: Vec<usize> = offsets.windows(2).map(|w| w[1] - w[0]).collect();
    for block in lengths.chunks(4) {
        let mut rows: Vec<&mut [f32]> = Vec::with_capacity(4);
        for &len in block {
            let (row, tail) = std::mem::take(&mut rest).split_at_mut(len);
            rows.push(row);
            rest = tail;
        }
        if let [a, b, c, d] = rows.as_mut_slice() {
            let common = a.len().min(b.len()).min(c.len()).min(d.len());
            let (ha, ta) = a.split_at_mut(a.len() - common);
            let (hb, tb) = b.split_at_mut(b.len() - common);
            let (hc, tc) = c.split_at_mut(c.len() - common);
            let (hd, td) = d.split_at_mut(d.len() - common);
            let (mut ra, mut rb, mut rc, mut rd) = (0f32, 0f32, 0f32, 0f32);
            let lanes = ta
                .iter_mut()
                .rev()
                .zip(tb.iter_mut().rev())
                .zip(tc.iter_mut().rev())
                .zip(td.iter_mut().rev());
            for (((xa, xb), xc), xd) in lanes {
                ra = *xa + decay * ra;
                rb = *xb + decay * rb;
                rc = *xc + decay * rc;
                rd = *xd + decay * rd;
                (*xa, *xb, *xc, *xd) = (ra, rb, rc, rd);
            }
            for (head, carried) in [ha, hb, hc, hd].into_iter().zip([ra, rb, rc, rd]) {
                scan(head, carried);
            }
        } else {
            for row in rows {
                scan(row, 0.0);
            }
        }
    }
}

/// Whitening statistics that can be gathered piece by piece (a stream of
/// rows, shards, threads) and merged: the count, the mean and the sum of
/// squared deviations from the mean, in f64. Each piece given to
/// [`add`](WhitenStats::add) is reduced with two passes over it (its own
/// mean, then its squared deviations), and pieces are combined with Chan et
/// al.'s pairwise update, so no sum of squares is ever taken about zero.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct WhitenStats {
    count: u64,
    mean: f64,
    m2: f64,
}

impl WhitenStats {
    /// Statistics of one piece of values.
    pub fn of(values: &[f32]) -> WhitenStats {
        if values.is_empty() {
            return WhitenStats::default();
        }
        let count = values.len() as f64;
        let mean = sum_f64(values, |v| v) / count;
        let m2 = sum_f64(values, |v| (v - mean) * (v - mean));
        WhitenStats {
            count: values.len() as u64,
            mean,
            m2,
        }
    }

    /// Adds a piece of values.
    pub fn add(&mut self, values: &[f32]) {
        self.merge(&WhitenStats::of(values));
    }

    /// Adds `count` copies of `value` (an advantage broadcast to a
    /// trajectory's valid tokens).
    pub fn add_repeated(&mut self, value: f32, count: usize) {
        self.merge(&WhitenStats {
            count: count as u64,
            mean: f64::from(value),
            m2: 0.0,
        });
    }

    /// Adds the values whose `mask` is true (veRL's `masked_whiten` takes
    /// its statistics from the valid positions only).
    pub fn add_masked(&mut self, values: &[f32], mask: &[bool]) {
        assert_eq!(values.len(), mask.len(), "one mask entry per value");
        if mask.iter().all(|&m| m) {
            self.add(values);
        } else {
            let kept: Vec<f32> = values
                .iter()
                .zip(mask)
                .filter(|&(_, &m)| m)
                .map(|(&v, _)| v)
                .collect();
            self.add(&kept);
        }
    }

    /// Merges statistics gathered elsewhere (Chan, Golub and LeVeque 1979).
    pub fn merge(&mut self, other: &WhitenStats) {
        if other.count == 0 {
            return;
        }
        if self.count == 0 {
            *self = *other;
            return;
        }
        let (na, nb) = (self.count as f64, other.count as f64);
        let n = na + nb;
        let delta = other.mean - self.mean;
        self.mean += delta * (nb / n);
        self.m2 += other.m2 + delta * delta * (na * nb / n);
        self.count += other.count;
    }

    /// Values seen.
    pub fn count(&self) -> u64 {
        self.count
    }

    /// veRL's `masked_whiten` from the statistics: `mean = sum / (n + 1e-8)`,
    /// the variance is the masked mean of squared deviations from that mean
    /// times `n / (n - 1)`, and the scale is `rsqrt(var + 1e-8)`. Fewer than
    /// two values is an error.
    pub fn whitening(&self) -> Result<Whitening, AlgoError> {
        if self.count < 2 {
            return Err(AlgoError::TooFewToWhiten(self.count as usize));
        }
        let n = self.count as f64;
        let mean = self.mean * n / (n + 1e-8);
        // Deviations from veRL's (slightly shrunk) mean rather than the exact one.
        let centred_sq = (self.m2 + n * (self.mean - mean) * (self.mean - mean)) / (n + 1e-8);
        let variance = centred_sq * n / (n - 1.0);
        Ok(Whitening {
            mean: mean as f32,
            scale: (1.0 / (variance + 1e-8).sqrt()) as f32,
        })
    }
}

/// The affine map of veRL's whitening, `a -> (a - mean) * scale`, from
/// [`WhitenStats::whitening`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Whitening {
    /// The masked mean.
    pub mean: f32,
    /// `rsqrt(var + 1e-8)`.
    pub scale: f32,
}

impl Whitening {
    /// Whitens values in place.
    pub fn apply(&self, values: &mut [f32]) {
        let (mean, scale) = (self.mean, self.scale);
        for v in values.iter_mut() {
            *v = (*v - mean) * scale;
        }
    }
}

/// veRL's `masked_whiten` with every position valid, in place.
pub fn whiten(values: &mut [f32]) -> Result<(), AlgoError> {
    WhitenStats::of(values).whitening()?.apply(values);
    Ok(())
}

/// Sum of `f(x)` in f64 over eight independent accumulators (vectorisable).
fn sum_f64(values: &[f32], f: impl Fn(f64) -> f64) -> f64 {
    let mut lanes = [0f64; 8];
    let chunks = values.chunks_exact(8);
    let tail: f64 = chunks.remainder().iter().map(|&v| f(f64::from(v))).sum();
    for chunk in chunks {
        for (lane, &v) in lanes.iter_mut().zip(chunk) {
            *lane += f(f64::from(v));
        }
    }
    lanes.iter().sum::<f64>() + tail
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn hand_computed_two_rows() {
        // gamma 0.5, lambda 0.5: decay 0.25.
        // Row 0: r = [0, 1], V = [0.2, 0.4]
        //   t1: delta = 1 + 0 - 0.4 = 0.6,             A1 = 0.6
        //   t0: delta = 0 + 0.5*0.4 - 0.2 = 0.0,       A0 = 0 + 0.25*0.6 = 0.15
        // Row 1: r = [2], V = [1]: A = 1
        let p = GaeParams {
            gamma: 0.5,
            lam: 0.5,
        };
        let (adv, ret) = gae_tokens(&[0.0, 1.0, 2.0], &[0.2, 0.4, 1.0], &[0, 2, 3], p);
        let expect_adv = [0.15, 0.6, 1.0];
        let expect_ret = [0.35, 1.0, 2.0];
        for i in 0..3 {
            assert!((adv[i] - expect_adv[i]).abs() < 1e-6, "{adv:?}");
            assert!((ret[i] - expect_ret[i]).abs() < 1e-6, "{ret:?}");
        }
    }

    #[test]
    fn holes_are_skipped_as_verl_skips_them() {
        let p = GaeParams {
            gamma: 0.5,
            lam: 0.5,
        };
        let masked = |r: &[f32], v: &[f32], m: &[bool]| {
            let (mut adv, mut ret) = (Vec::new(), Vec::new());
            gae_tokens_masked_into(r, v, m, &[0, r.len()], p, &mut adv, &mut ret);
            (adv, ret)
        };
        // Hole in the middle: r = [0, 9, 1], V = [0.2, 5, 0.4], mask [1, 0, 1]
        //   t2: delta = 1 - 0.4 = 0.6,                        A2 = 0.6
        //   t1: hole, A1 = 0, nextvalue stays 0.4, running stays 0.6
        //   t0: delta = 0 + 0.5*0.4 - 0.2 = 0,  A0 = 0 + 0.25*0.6 = 0.15
        // (the example of hand_computed_two_rows without the hole).
        let (adv, ret) = masked(&[0.0, 9.0, 1.0], &[0.2, 5.0, 0.4], &[true, false, true]);
        let (want_adv, want_ret) = ([0.15, 0.0, 0.6], [0.35, 0.0, 1.0]);
        for i in 0..3 {
            assert!((adv[i] - want_adv[i]).abs() < 1e-6, "{adv:?}");
            assert!((ret[i] - want_ret[i]).abs() < 1e-6, "{ret:?}");
        }
        // Hole first: the valid tail is untouched, the hole 0.
        //   t1: delta = 1 - 0.4 = 0.6; t0 hole.
        let (adv, ret) = masked(&[7.0, 1.0], &[3.0, 0.4], &[false, true]);
        assert_eq!(adv[0], 0.0);
        assert_eq!(ret[0], 0.0);
        assert!((adv[1] - 0.6).abs() < 1e-6 && (ret[1] - 1.0).abs() < 1e-6);
        // Hole last: its reward 2 is dropped and V after the valid part is 0.
        //   t1: delta = 1 - 0.4 = 0.6 (not 1 + 0.5*3 - 0.4)
        let (adv, _) = masked(&[0.0, 1.0, 2.0], &[0.2, 0.4, 3.0], &[true, true, false]);
        for (got, want) in adv.iter().zip([0.15, 0.6, 0.0]) {
            assert!((got - want).abs() < 1e-6, "{adv:?}");
        }
        // Every position a hole: all 0.
        let (adv, ret) = masked(&[1.0, 2.0], &[0.5, 0.5], &[false, false]);
        assert_eq!((adv, ret), (vec![0.0, 0.0], vec![0.0, 0.0]));
        // No hole: the unmasked recurrence, bit for bit.
        let (r, v) = ([0.0, 1.0, 2.0], [0.2, 0.4, 1.0]);
        let mut adv = Vec::new();
        let mut ret = Vec::new();
        gae_tokens_masked_into(&r, &v, &[true; 3], &[0, 2, 3], p, &mut adv, &mut ret);
        assert_eq!((adv, ret), gae_tokens(&r, &v, &[0, 2, 3], p));
    }

    #[test]
    fn masked_statistics_take_the_valid_positions_only() {
        let mut masked = WhitenStats::default();
        masked.add_masked(&[1.0, 100.0, 2.0, 3.0], &[true, false, true, true]);
        assert_eq!(masked, WhitenStats::of(&[1.0, 2.0, 3.0]));
        let mut v = [1.0f32, 100.0, 3.0];
        zero_holes(&mut v, &[true, false, true]);
        assert_eq!(v, [1.0, 0.0, 3.0]);
    }

    #[test]
    fn whitening_matches_the_formula_and_refuses_one_position() {
        let mut v = [1.0f32, 2.0, 3.0];
        whiten(&mut v).unwrap();
        // mean 2, unbiased var 1: (x - 2) / sqrt(1 + 1e-8)
        for (got, want) in v.iter().zip([-1.0, 0.0, 1.0]) {
            assert!((got - want).abs() < 1e-6, "{v:?}");
        }
        assert_eq!(whiten(&mut [1.0]), Err(AlgoError::TooFewToWhiten(1)));
        assert_eq!(whiten(&mut []), Err(AlgoError::TooFewToWhiten(0)));
    }

    /// The recurrence written plainly, one position at a time.
    fn reference(
        rewards: &[f32],
        values: &[f32],
        offsets: &[usize],
        p: GaeParams,
    ) -> (Vec<f32>, Vec<f32>) {
        let (mut adv, mut ret) = (vec![0f32; rewards.len()], vec![0f32; rewards.len()]);
        for row in offsets.windows(2) {
            let (mut next_value, mut running) = (0f32, 0f32);
            for t in (row[0]..row[1]).rev() {
                running = rewards[t] + p.gamma * next_value - values[t] + p.gamma * p.lam * running;
                next_value = values[t];
                adv[t] = running;
                ret[t] = running + values[t];
            }
        }
        (adv, ret)
    }

    /// veRL's masked whitening written plainly in f64 over the whole slice:
    /// (mean, unbiased variance) and the whitened values.
    fn whiten_in_memory(values: &[f32]) -> (f64, f64, Vec<f64>) {
        let n = values.len() as f64;
        let mean = values.iter().map(|&v| f64::from(v)).sum::<f64>() / (n + 1e-8);
        let centred = values
            .iter()
            .map(|&v| (f64::from(v) - mean).powi(2))
            .sum::<f64>()
            / (n + 1e-8);
        let var = centred * n / (n - 1.0);
        let out = values
            .iter()
            .map(|&v| (f64::from(v) - mean) / (var + 1e-8).sqrt())
            .collect();
        (mean, var, out)
    }

    #[test]
    fn streamed_statistics_stay_exact_far_from_zero() {
        // Mean 1000, spread 0.01: a sum of squares about zero in f64 would
        // lose about eps * mean^2 / var ~ 1e-5 of the variance.
        let values: Vec<f32> = (0..100_000)
            .map(|i| 1000.0 + ((i * 7919) % 1000) as f32 * 1e-5)
            .collect();
        let mut stats = WhitenStats::default();
        for piece in values.chunks(1000) {
            stats.add(piece);
        }
        let (_, var, _) = whiten_in_memory(&values);
        let n = values.len() as f64;
        let streamed = stats.m2 / (n - 1.0);
        assert!(((streamed - var) / var).abs() < 1e-9, "{streamed} vs {var}");
    }

    proptest! {
        #[test]
        fn whitening_streamed_in_pieces_matches_the_in_memory_formula(
            values in proptest::collection::vec(-10.0f32..10.0, 2..600),
            offset in prop_oneof![Just(0.0f32), -50.0f32..50.0],
            cuts in proptest::collection::vec(0usize..600, 0..12),
        ) {
            let values: Vec<f32> = values.iter().map(|v| v + offset).collect();
            let spread = values.iter().cloned().fold(f32::MIN, f32::max) - values.iter().cloned().fold(f32::MAX, f32::min);
            prop_assume!(spread > 1e-2);
            // Stream the values in pieces cut at arbitrary points, merging
            // statistics of pieces gathered separately as a second stream.
            let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c % values.len()).collect();
            cuts.extend([0, values.len()]);
            cuts.sort_unstable();
            let (mut first, mut second) = (WhitenStats::default(), WhitenStats::default());
            for (k, piece) in cuts.windows(2).enumerate() {
                let target = if k % 2 == 0 { &mut first } else { &mut second };
                target.add(&values[piece[0]..piece[1]]);
            }
            first.merge(&second);
            prop_assert_eq!(first.count(), values.len() as u64);
            let (mean, var, want) = whiten_in_memory(&values);
            let whitening = first.whitening().unwrap();
            prop_assert!((f64::from(whitening.mean) - mean).abs() <= 1e-6 * mean.abs().max(1.0));
            prop_assert!((f64::from(whitening.scale) - 1.0 / (var + 1e-8).sqrt()).abs() <= 1e-6 / (var + 1e-8).sqrt());
            let mut streamed = values.clone();
            whitening.apply(&mut streamed);
            let mut whole = values.clone();
            whiten(&mut whole).unwrap();
            for i in 0..values.len() {
                // f32 arithmetic on (v - mean) * scale rounds at the scale
                // of |v| * scale, which exceeds the result far from zero.
                let rounding = 4.0 * f64::from(f32::EPSILON) * (f64::from(values[i].abs()) + mean.abs()) * f64::from(whitening.scale);
                let tolerance = 1e-6 * want[i].abs().max(1.0) + rounding;
                prop_assert!((f64::from(streamed[i]) - want[i]).abs() <= tolerance, "{i}: {} vs {}", streamed[i], want[i]);
                prop_assert!(f64::from((streamed[i] - whole[i]).abs()) <= tolerance, "{i}: {} vs {}", streamed[i], whole[i]);
            }
        }

        #[test]
        fn rows_of_any_lengths_match_the_plain_recurrence(
            lengths in proptest::collection::vec(0usize..12, 0..11),
            seed in 0u32..1000,
        ) {
            let mut offsets = vec![0];
            for len in &lengths {
                offsets.push(offsets.last().unwrap() + len);
            }
            let n = *offsets.last().unwrap();
            let rewards: Vec<f32> = (0..n).map(|i| ((i as u32 * 7 + seed) % 5) as f32 - 2.0).collect();
            let values: Vec<f32> = (0..n).map(|i| ((i as u32 * 3 + seed) % 11) as f32 / 5.0 - 1.0).collect();
            let p = GaeParams { gamma: 0.9, lam: 0.8 };
            let (adv, ret) = gae_tokens(&rewards, &values, &offsets, p);
            let (want_adv, want_ret) = reference(&rewards, &values, &offsets, p);
            for i in 0..n {
                prop_assert!((adv[i] - want_adv[i]).abs() <= 1e-5 * want_adv[i].abs().max(1.0), "adv {i}: {} vs {}", adv[i], want_adv[i]);
                prop_assert!((ret[i] - want_ret[i]).abs() <= 1e-5 * want_ret[i].abs().max(1.0), "ret {i}");
            }
        }

        #[test]
        fn lambda_one_gamma_one_gives_reward_to_go_minus_value(
            rewards in proptest::collection::vec(-2.0f32..2.0, 1..30),
            values in proptest::collection::vec(-2.0f32..2.0, 30),
        ) {
            let n = rewards.len();
            let values = &values[..n];
            let (adv, ret) = gae_tokens(&rewards, values, &[0, n], GaeParams { gamma: 1.0, lam: 1.0 });
            for t in 0..n {
                let to_go: f32 = rewards[t..].iter().sum();
                prop_assert!((adv[t] - (to_go - values[t])).abs() < 1e-4);
                prop_assert!((ret[t] - to_go).abs() < 1e-4);
            }
        }

        #[test]
        fn whitened_values_have_zero_mean_and_unit_unbiased_variance(
            values in proptest::collection::vec(-10.0f32..10.0, 2..200)
        ) {
            let spread = values.iter().cloned().fold(f32::MIN, f32::max) - values.iter().cloned().fold(f32::MAX, f32::min);
            prop_assume!(spread > 1e-2);
            let mut w = values.clone();
            whiten(&mut w).unwrap();
            let n = w.len() as f64;
            let mean = w.iter().map(|&x| f64::from(x)).sum::<f64>() / n;
            let var = w.iter().map(|&x| (f64::from(x) - mean).powi(2)).sum::<f64>() / (n - 1.0);
            prop_assert!(mean.abs() < 1e-4);
            prop_assert!((var - 1.0).abs() < 1e-3);
        }
    }
}
