//! pass@k: the chance that at least one of k answers drawn from a policy
//! solves a task, estimated from n ≥ k drawn answers of which c succeeded.
//!
//! The unbiased estimator of Chen et al. 2021 ("Evaluating Large Language
//! Models Trained on Code", eq. 1):
//! `pass@k = 1 - C(n - c, k) / C(n, k)`, computed as the product
//! `1 - Π_{i = n-c+1..n} (1 - k / i)` so that no binomial overflows. RL
//! researchers read pass@1 against pass@k to tell a policy that learned new
//! solutions (pass@k rises) from one that sharpened onto those it could
//! already sample (pass@1 rises towards a flat pass@k).
//!
//! ```
//! use embodyflow_algos::pass_at_k::pass_at_k;
//! assert_eq!(pass_at_k(4, 1, 1), 0.25); // pass@1 = c / n
//! assert_eq!(pass_at_k(4, 1, 4), 1.0); // pass@n = any success
//! assert!((pass_at_k(4, 1, 2) - 0.5).abs() < 1e-12); // 1 - C(3,2)/C(4,2)
//! ```

/// Unbiased pass@k from `n` answers with `correct` successes (`k <= n`).
///
/// # Panics
/// If `correct > n`, `k == 0` or `k > n` (callers choose k from n).
pub fn pass_at_k(n: usize, correct: usize, k: usize) -> f64 {
    assert!(
        correct <= n && k >= 1 && k <= n,
        "pass@k needs 1 <= k <= n and c <= n (n {n}, c {correct}, k {k})"
    );
    if n - correct < k {
        return 1.0;
    }
    1.0 - ((n - correct + 1)..=n)
        .map(|i| 1.0 - k as f64 / i as f64)
        .product::<f64>()
}

/// The k reported for n answers per task: 1, 2, 4, ... and n itself.
pub fn reported_ks(n: usize) -> Vec<usize> {
    let mut ks: Vec<usize> = std::iter::successors(Some(1usize), |k| Some(k * 2))
        .take_while(|&k| k < n)
        .collect();
    if n >= 1 {
        ks.push(n);
    }
    ks
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// C(n, k) in f64 by the multiplicative formula (exact for small n).
    fn binomial(n: usize, k: usize) -> f64 {
        if k > n {
            return 0.0;
        }
        (0..k).fold(1.0, |acc, i| acc * (n - i) as f64 / (i + 1) as f64)
    }

    #[test]
    fn matches_the_binomial_definition() {
        for n in 1..=12 {
            for c in 0..=n {
                for k in 1..=n {
                    let expected = 1.0 - binomial(n - c, k) / binomial(n, k);
                    let got = pass_at_k(n, c, k);
                    assert!(
                        (got - expected).abs() < 1e-12,
                        "n {n} c {c} k {k}: {got} vs {expected}"
                    );
                }
            }
        }
    }

    #[test]
    fn reports_powers_of_two_and_n() {
        assert_eq!(reported_ks(1), vec![1]);
        assert_eq!(reported_ks(8), vec![1, 2, 4, 8]);
        assert_eq!(reported_ks(12), vec![1, 2, 4, 8, 12]);
    }

    proptest! {
        #[test]
        fn pass_at_one_is_the_success_rate_and_rises_with_k(n in 1usize..200, frac in 0.0f64..=1.0) {
            let c = ((n as f64) * frac).round() as usize;
            prop_assert!((pass_at_k(n, c, 1) - c as f64 / n as f64).abs() < 1e-9);
            prop_assert_eq!(pass_at_k(n, c, n), if c > 0 { 1.0 } else { 0.0 });
            let mut last = 0.0;
            for k in 1..=n {
                let p = pass_at_k(n, c, k);
                prop_assert!((0.0..=1.0).contains(&p));
                prop_assert!(p >= last - 1e-12);
                last = p;
            }
        }
    }
}
