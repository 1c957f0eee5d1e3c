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
    x.iter().zip(w).map(|(&v, &g)| (g as f64 * (v as f64 * r)) as f32).collect()
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
