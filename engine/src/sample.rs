//! Sampling: greedy, temperature, top-k, top-p (vLLM semantics), seeded.

/// Index of the largest value; the lowest index wins ties (torch.argmax, vLLM).
pub fn argmax(x: &[f32]) -> usize {
    let mut best = 0;
    for (i, &v) in x.iter().enumerate() {
        if v > x[best] {
            best = i;
        }
    }
    best
}

#[derive(Debug, Clone, PartialEq)]
pub struct SamplingParams {
    /// 0 means greedy.
    pub temperature: f32,
    /// 0 (or >= vocab) disables top-k.
    pub top_k: usize,
    /// 1.0 disables top-p.
    pub top_p: f32,
    pub seed: Option<u64>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            seed: None,
        }
    }
}

impl SamplingParams {
    pub fn greedy() -> Self {
        Self::default()
    }
    pub fn is_greedy(&self) -> bool {
        self.temperature <= 0.0
    }
}

/// xoshiro256** seeded through SplitMix64: small, fast and reproducible across platforms.
#[derive(Debug, Clone)]
pub struct Rng {
    s: [u64; 4],
}

impl Rng {
    pub fn new(seed: u64) -> Rng {
        let mut z = seed;
        let mut next = || {
            z = z.wrapping_add(0x9E3779B97F4A7C15);
            let mut x = z;
            x = (x ^ (x >> 30)).wrapping_mul(0xBF58476D1CE4E5B9);
            x = (x ^ (x >> 27)).wrapping_mul(0x94D049BB133111EB);
            x ^ (x >> 31)
        };
        Rng {
            s: [next(), next(), next(), next()],
        }
    }
    /// A seed from the clock, for requests without one.
    pub fn from_entropy() -> Rng {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        Rng::new(t ^ COUNTER.fetch_add(0x632BE59BD9B4E019, std::sync::atomic::Ordering::Relaxed))
    }
    pub fn next_u64(&mut self) -> u64 {
        let r = self.s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = self.s[1] << 17;
        self.s[2] ^= self.s[0];
        self.s[3] ^= self.s[1];
        self.s[1] ^= self.s[2];
        self.s[0] ^= self.s[3];
        self.s[2] ^= t;
        self.s[3] = self.s[3].rotate_left(45);
        r
    }
    /// Uniform in [0, 1).
    pub fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
}

/// The distribution plain sampling draws from: softmax(logits / T) restricted by top-k and top-p.
/// Greedy params give a one-hot at the argmax.
pub fn probs(logits: &[f32], p: &SamplingParams) -> Vec<f64> {
    let n = logits.len();
    if p.is_greedy() {
        let mut out = vec![0.0; n];
        out[argmax(logits)] = 1.0;
        return out;
    }
    let t = p.temperature as f64;
    let mut z: Vec<f64> = logits.iter().map(|&l| l as f64 / t).collect();
    // top-k: keep values >= the k-th largest (ties kept, as vLLM's threshold mask does).
    if p.top_k > 0 && p.top_k < n {
        let mut sorted = z.clone();
        sorted.sort_by(|a, b| b.partial_cmp(a).unwrap_or(std::cmp::Ordering::Equal));
        let kth = sorted[p.top_k - 1];
        for v in z.iter_mut() {
            if *v < kth {
                *v = f64::NEG_INFINITY;
            }
        }
    }
    let m = z.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let mut e: Vec<f64> = z
        .iter()
        .map(|&v| {
            if v == f64::NEG_INFINITY {
                0.0
            } else {
                (v - m).exp()
            }
        })
        .collect();
    let s: f64 = e.iter().sum();
    for v in e.iter_mut() {
        *v /= s;
    }
    // top-p: drop the smallest tokens whose ascending cumulative mass stays <= 1 - p; keep at least one.
    if p.top_p < 1.0 {
        let mut order: Vec<usize> = (0..n).collect();
        order.sort_by(|&a, &b| {
            e[a].partial_cmp(&e[b])
                .unwrap_or(std::cmp::Ordering::Equal)
                .then(b.cmp(&a))
        });
        let mut cum = 0.0;
        let limit = 1.0 - p.top_p as f64;
        for (rank, &i) in order.iter().enumerate() {
            cum += e[i];
            if cum <= limit && rank + 1 < n {
                e[i] = 0.0;
            } else {
                break;
            }
        }
        let s: f64 = e.iter().sum();
        for v in e.iter_mut() {
            *v /= s;
        }
    }
    e
}

/// Draw an index from a normalised distribution.
pub fn draw(probs: &[f64], rng: &mut Rng) -> usize {
    draw_u(probs, rng.uniform())
}

/// The index `draw` picks for the uniform `u`: the first whose cumulative probability exceeds it.
pub fn draw_u(probs: &[f64], u: f64) -> usize {
    let mut cum = 0.0;
    let mut last = 0;
    for (i, &p) in probs.iter().enumerate() {
        if p > 0.0 {
            cum += p;
            last = i;
            if u < cum {
                return i;
            }
        }
    }
    last
}

pub fn sample(logits: &[f32], p: &SamplingParams, rng: &mut Rng) -> u32 {
    sample_u(logits, p, uniform_for(p, rng))
}

/// The uniform `sample` consumes from `rng` for these params (none for greedy: 0.0), for a
/// backend that samples on the device with `sample_u`'s rule.
pub fn uniform_for(p: &SamplingParams, rng: &mut Rng) -> f64 {
    if p.is_greedy() {
        0.0
    } else {
        rng.uniform()
    }
}

/// `sample` with the uniform given (what a backend sampling on the device is handed; greedy
/// params ignore it).
pub fn sample_u(logits: &[f32], p: &SamplingParams, u: f64) -> u32 {
    if p.is_greedy() {
        return argmax(logits) as u32;
    }
    draw_u(&probs(logits, p), u) as u32
}

/// log-softmax of the raw logits (what OpenAI logprobs report).
pub fn log_softmax(logits: &[f32]) -> Vec<f32> {
    let m = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let lse = logits
        .iter()
        .map(|&l| (l as f64 - m).exp())
        .sum::<f64>()
        .ln()
        + m;
    logits.iter().map(|&l| (l as f64 - lse) as f32).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn top_k_and_top_p() {
        let logits = [3.0f32, 2.0, 1.0, 0.0];
        let p = probs(
            &logits,
            &SamplingParams {
                temperature: 1.0,
                top_k: 2,
                top_p: 1.0,
                seed: None,
            },
        );
        assert!(p[2] == 0.0 && p[3] == 0.0);
        let e = (1f64).exp();
        assert!((p[0] - e / (e + 1.0)).abs() < 1e-12);
        // softmax of [3,2,1,0] = [.644,.237,.087,.032]; top_p .7 keeps the two largest.
        let p = probs(
            &logits,
            &SamplingParams {
                temperature: 1.0,
                top_k: 0,
                top_p: 0.7,
                seed: None,
            },
        );
        assert!(p[0] > 0.0 && p[1] > 0.0 && p[2] == 0.0 && p[3] == 0.0);
        let p = probs(
            &logits,
            &SamplingParams {
                temperature: 1.0,
                top_k: 0,
                top_p: 0.01,
                seed: None,
            },
        );
        assert_eq!(p[0], 1.0);
    }

    #[test]
    fn seeded_draws_repeat_and_follow_the_distribution() {
        let probs = [0.1, 0.6, 0.3];
        let mut a = Rng::new(7);
        let mut b = Rng::new(7);
        let xs: Vec<usize> = (0..100).map(|_| draw(&probs, &mut a)).collect();
        let ys: Vec<usize> = (0..100).map(|_| draw(&probs, &mut b)).collect();
        assert_eq!(xs, ys);
        let mut r = Rng::new(1);
        let mut c = [0usize; 3];
        for _ in 0..30000 {
            c[draw(&probs, &mut r)] += 1;
        }
        for i in 0..3 {
            assert!((c[i] as f64 / 30000.0 - probs[i]).abs() < 0.015, "{c:?}");
        }
    }
}
