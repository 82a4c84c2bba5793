//! The arithmetic every benchmark reports its figures with.

/// The middle value (the upper one of an even count). `v` is not empty.
pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// `n` things done in `t`, per second.
pub fn per_s(n: usize, t: std::time::Duration) -> f64 {
    n as f64 / t.as_secs_f64().max(1e-9)
}
