//! Plain f32 building blocks of the CPU reference backend.

/// y[o] = sum_i w[o, i] * x[i] for a row-major `w: [out, inp]`.
pub fn matvec(w: &[f32], x: &[f32], out: usize, inp: usize, y: &mut [f32]) {
    debug_assert_eq!(w.len(), out * inp);
    debug_assert_eq!(x.len(), inp);
    for (o, yo) in y.iter_mut().enumerate().take(out) {
        *yo = dot(&w[o * inp..(o + 1) * inp], x);
    }
}

/// Dot product with f64 accumulation: the reference backend trades speed for agreement with float64.
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f64; 4];
    let chunks = a.len() / 4;
    for c in 0..chunks {
        for j in 0..4 {
            acc[j] += a[c * 4 + j] as f64 * b[c * 4 + j] as f64;
        }
    }
    let mut s = acc[0] + acc[1] + acc[2] + acc[3];
    for i in chunks * 4..a.len() {
        s += a[i] as f64 * b[i] as f64;
    }
    s as f32
}

pub fn linear(w: &[f32], x: &[f32], out: usize) -> Vec<f32> {
    let inp = x.len();
    let mut y = vec![0f32; out];
    matvec(w, x, out, inp, &mut y);
    y
}

/// RMSNorm: w * x / sqrt(mean(x^2) + eps).
pub fn rmsnorm(x: &[f32], w: &[f32], eps: f64) -> Vec<f32> {
    let ms = x.iter().map(|&v| v as f64 * v as f64).sum::<f64>() / x.len() as f64;
    let r = 1.0 / (ms + eps).sqrt();
    x.iter()
        .zip(w)
        .map(|(&v, &g)| (g as f64 * (v as f64 * r)) as f32)
        .collect()
}

/// RMSNorm in place over consecutive chunks of `d` (per-head q/k norm).
pub fn rmsnorm_heads(x: &mut [f32], w: &[f32], d: usize, eps: f64) {
    for h in x.chunks_mut(d) {
        let y = rmsnorm(h, w, eps);
        h.copy_from_slice(&y);
    }
}

/// torch.nn.functional.softplus (beta 1, threshold 20).
pub fn softplus(x: f32) -> f32 {
    if x > 20.0 {
        x
    } else {
        ((x as f64).exp().ln_1p()) as f32
    }
}

pub fn silu(x: f32) -> f32 {
    (x as f64 / (1.0 + (-(x as f64)).exp())) as f32
}

pub fn sigmoid(x: f32) -> f32 {
    (1.0 / (1.0 + (-(x as f64)).exp())) as f32
}

/// NeoX rotate-half RoPE on the first `cos.len()*2` dims of each head of width `d`.
pub fn rope_heads(x: &mut [f32], d: usize, cos: &[f32], sin: &[f32]) {
    let half = cos.len();
    for h in x.chunks_mut(d) {
        for i in 0..half {
            let a = h[i] as f64;
            let b = h[i + half] as f64;
            let (c, s) = (cos[i] as f64, sin[i] as f64);
            h[i] = (a * c - b * s) as f32;
            h[i + half] = (b * c + a * s) as f32;
        }
    }
}

/// One query head against `n` keys: softmax(q·k * scale) · v in f64, with an optional learned
/// sink logit that joins the denominator and has no value (vLLM's attention sinks).
pub fn attend<'a>(
    q: &[f32],
    n: usize,
    key: impl Fn(usize) -> &'a [f32],
    value: impl Fn(usize) -> &'a [f32],
    scale: f64,
    sink: Option<f64>,
    out: &mut [f32],
) {
    let scores: Vec<f64> = (0..n).map(|j| dot(q, key(j)) as f64 * scale).collect();
    let m = scores
        .iter()
        .copied()
        .fold(sink.unwrap_or(f64::NEG_INFINITY), f64::max);
    let ps: Vec<f64> = scores.iter().map(|s| (s - m).exp()).collect();
    let denom = ps.iter().sum::<f64>() + sink.map_or(0.0, |s| (s - m).exp());
    let mut acc = vec![0f64; out.len()];
    for (j, p) in ps.iter().enumerate() {
        for (a, &v) in acc.iter_mut().zip(value(j)) {
            *a += p * v as f64;
        }
    }
    for (o, a) in out.iter_mut().zip(&acc) {
        *o = (a / denom) as f32;
    }
}

/// Multiply attention output by softplus(gate logits): one gate per head or per element.
pub fn apply_gate(
    attn: &mut [f32],
    gate_logits: Vec<f32>,
    gating: crate::config::Gating,
    head_dim: usize,
) {
    let gate: Vec<f32> = gate_logits.into_iter().map(softplus).collect();
    match gating {
        crate::config::Gating::PerHead => {
            for (h, chunk) in attn.chunks_mut(head_dim).enumerate() {
                for a in chunk {
                    *a *= gate[h];
                }
            }
        }
        crate::config::Gating::PerElement => {
            for (a, g) in attn.iter_mut().zip(&gate) {
                *a *= g;
            }
        }
        crate::config::Gating::None => {}
    }
}
