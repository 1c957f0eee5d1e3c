//! Typed Linear weights by name: BF16/F16/F32 dense, or compressed-tensors NVFP4
//! (`weight_packed` U8 [out,in/2] low nibble = even column, `weight_scale` E4M3 [out,in/16],
//! `weight_global_scale` F32 that divides). The format is decided per tensor by which suffixes
//! exist, never by `quantization_config.ignore`.
use super::store::{TensorView, WeightStore};
use crate::error::{EngineError, Result};
use safetensors::Dtype;

pub const E2M1: [f32; 16] = [
    0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0,
];
pub const NVFP4_BLOCK: usize = 16;

/// OCP FP8 E4M3FN (bias 7, no infinities, 0x7F/0xFF NaN).
pub fn e4m3_to_f32(b: u8) -> f32 {
    let sign = if b & 0x80 != 0 { -1.0 } else { 1.0 };
    let exp = ((b >> 3) & 0x0F) as i32;
    let man = (b & 0x07) as f32;
    if exp == 0x0F && (b & 0x07) == 0x07 {
        return f32::NAN;
    }
    if exp == 0 {
        sign * man / 8.0 * 2f32.powi(-6)
    } else {
        sign * (1.0 + man / 8.0) * 2f32.powi(exp - 7)
    }
}

/// f32 to the nearest E4M3FN value (ties to even), saturating to +-448 (as the GPU's
/// `cvt.rn.satfinite.e4m3x2.f32`); NaN maps to the NaN code 0x7F.
pub fn f32_to_e4m3(x: f32) -> u8 {
    if x.is_nan() {
        return 0x7F;
    }
    let sign = if x.is_sign_negative() { 0x80u8 } else { 0 };
    let a = x.abs();
    if a >= 448.0 {
        return sign | 0x7E;
    }
    // Candidates are the 127 finite magnitudes in increasing order; binary search the neighbours.
    let (mut lo, mut hi) = (0u8, 0x7Eu8);
    while hi - lo > 1 {
        let mid = (lo + hi) / 2;
        if e4m3_to_f32(mid) <= a {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    let (vl, vh) = (e4m3_to_f32(lo), e4m3_to_f32(hi));
    let code = if a - vl < vh - a {
        lo
    } else if a - vl > vh - a {
        hi
    } else if lo & 1 == 0 {
        lo
    } else {
        hi
    };
    sign | code
}

/// `x` as stored in an FP8 E4M3 K/V cache with this scale and read back.
pub fn fp8_kv_round(x: f32, scale: f32) -> f32 {
    e4m3_to_f32(f32_to_e4m3(x / scale)) * scale
}

/// (k_scale, v_scale) of an FP8 K/V cache for the layer at `prefix` (`model.layers.N`):
/// `{prefix}.self_attn.{k,v}_scale` when the checkpoint has them (positive and finite), else 1.0.
pub fn kv_scale_pair(store: &WeightStore, prefix: &str) -> Result<(f32, f32)> {
    let one = |n: &str| -> Result<f32> {
        let name = format!("{prefix}.self_attn.{n}");
        match store.scalar(&name)? {
            Some(v) if v.is_finite() && v > 0.0 => Ok(v),
            Some(v) => Err(EngineError::Other(format!(
                "{name} = {v}: a K/V scale must be positive and finite"
            ))),
            None => Ok(1.0),
        }
    };
    Ok((one("k_scale")?, one("v_scale")?))
}

/// [`kv_scale_pair`] of every target layer.
pub fn kv_scales(store: &WeightStore, layers: usize) -> Result<Vec<(f32, f32)>> {
    (0..layers)
        .map(|i| kv_scale_pair(store, &format!("model.layers.{i}")))
        .collect()
}

pub fn dtype_name(d: Dtype) -> String {
    format!("{d:?}")
}

/// Elements of a float tensor (BF16, F16, F32, F64, F8_E4M3) as f32.
pub fn to_f32(t: &TensorView) -> Result<Vec<f32>> {
    let d = t.data;
    Ok(match t.dtype {
        Dtype::BF16 => d
            .chunks_exact(2)
            .map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect(),
        Dtype::F16 => d
            .chunks_exact(2)
            .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect(),
        Dtype::F32 => d
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
        Dtype::F64 => d
            .chunks_exact(8)
            .map(|c| f64::from_le_bytes(c.try_into().unwrap()) as f32)
            .collect(),
        Dtype::F8_E4M3 => d.iter().map(|&b| e4m3_to_f32(b)).collect(),
        other => {
            return Err(EngineError::Dtype {
                name: t.name.to_string(),
                expected: "BF16, F16, F32 or F8_E4M3".into(),
                found: dtype_name(other),
            })
        }
    })
}

/// A scalar F32/BF16 tensor (shape [] or [1]).
pub fn scalar(t: &TensorView) -> Result<f32> {
    let n: usize = t.shape.iter().product();
    if n != 1 {
        return Err(EngineError::Shape {
            name: t.name.into(),
            expected: vec![1],
            found: t.shape.to_vec(),
        });
    }
    Ok(to_f32(t)?[0])
}

/// One Linear `W[out, in]` as stored.
#[derive(Debug, Clone, Copy)]
pub enum LinearSource<'a> {
    Dense(TensorView<'a>),
    Nvfp4 {
        packed: TensorView<'a>,
        scale: TensorView<'a>,
        global_scale: f32,
        out: usize,
        inp: usize,
    },
}

impl<'a> LinearSource<'a> {
    /// Dequantized row-major f32 `[out, in]`.
    pub fn to_f32(&self) -> Result<Vec<f32>> {
        match self {
            LinearSource::Dense(t) => to_f32(t),
            LinearSource::Nvfp4 {
                packed,
                scale,
                global_scale,
                out,
                inp,
            } => Ok(dequant_nvfp4(
                packed.data,
                scale.data,
                *global_scale,
                *out,
                *inp,
            )),
        }
    }

    pub fn bytes(&self) -> usize {
        match self {
            LinearSource::Dense(t) => t.data.len(),
            LinearSource::Nvfp4 { packed, scale, .. } => packed.data.len() + scale.data.len() + 4,
        }
    }
}

/// W[r, c] = E2M1(code(r, c)) * E4M3(scale[r, c/16]) / global_scale.
pub fn dequant_nvfp4(
    packed: &[u8],
    scale: &[u8],
    global_scale: f32,
    out: usize,
    inp: usize,
) -> Vec<f32> {
    let mut w = vec![0f32; out * inp];
    let inv = 1.0 / global_scale as f64;
    for r in 0..out {
        for c in 0..inp {
            let b = packed[r * inp / 2 + c / 2];
            let code = if c % 2 == 0 { b & 0x0F } else { b >> 4 };
            let s = e4m3_to_f32(scale[r * (inp / NVFP4_BLOCK) + c / NVFP4_BLOCK]) as f64;
            // E2M1 × E4M3 is exact in f64; the division by the global scale rounds once.
            w[r * inp + c] = (E2M1[code as usize] as f64 * s * inv) as f32;
        }
    }
    w
}

impl WeightStore {
    /// The Linear at `prefix` (e.g. `model.layers.3.mlp.experts.7.down_proj`) with shape [out, in].
    pub fn linear(&self, prefix: &str, out: usize, inp: usize) -> Result<LinearSource<'_>> {
        let packed_name = format!("{prefix}.weight_packed");
        if self.contains(&packed_name) {
            if inp % NVFP4_BLOCK != 0 {
                return Err(EngineError::Other(format!(
                    "{prefix}: NVFP4 needs an input width divisible by 16, got {inp}"
                )));
            }
            let packed = self.expect(&packed_name, &[out, inp / 2])?;
            if packed.dtype != Dtype::U8 {
                return Err(EngineError::Dtype {
                    name: packed_name,
                    expected: "U8".into(),
                    found: dtype_name(packed.dtype),
                });
            }
            let scale_name = format!("{prefix}.weight_scale");
            let scale = self.get(&scale_name).map_err(|_| EngineError::MissingTensor {
                name: scale_name.clone(),
                hint: " (an NVFP4 Linear needs weight_packed, weight_scale and weight_global_scale)".into(),
            })?;
            if scale.shape != [out, inp / NVFP4_BLOCK] {
                return Err(EngineError::Shape {
                    name: scale_name,
                    expected: vec![out, inp / NVFP4_BLOCK],
                    found: scale.shape.to_vec(),
                });
            }
            if scale.dtype != Dtype::F8_E4M3 {
                return Err(EngineError::Dtype {
                    name: scale_name,
                    expected: "F8_E4M3".into(),
                    found: dtype_name(scale.dtype),
                });
            }
            let gs_name = format!("{prefix}.weight_global_scale");
            let gs = self.get(&gs_name).map_err(|_| EngineError::MissingTensor {
                name: gs_name.clone(),
                hint:
                    " (an NVFP4 Linear needs weight_packed, weight_scale and weight_global_scale)"
                        .into(),
            })?;
            let global_scale = scalar(&gs)?;
            if !(global_scale.is_finite() && global_scale > 0.0) {
                return Err(EngineError::Other(format!(
                    "{gs_name} is {global_scale}; it must be a positive finite divisor"
                )));
            }
            return Ok(LinearSource::Nvfp4 {
                packed,
                scale,
                global_scale,
                out,
                inp,
            });
        }
        let name = format!("{prefix}.weight");
        if !self.contains(&name) {
            return Err(EngineError::MissingTensor {
                name,
                hint: format!(" (nor `{packed_name}`: the checkpoint has neither a dense nor an NVFP4 form of this Linear)"),
            });
        }
        let t = self.expect(&name, &[out, inp])?;
        match t.dtype {
            Dtype::BF16 | Dtype::F16 | Dtype::F32 => Ok(LinearSource::Dense(t)),
            other => Err(EngineError::Dtype {
                name,
                expected: "BF16, F16 or F32".into(),
                found: dtype_name(other),
            }),
        }
    }

    /// A scalar float tensor (shape [] or [1]) as f32, or None when absent.
    pub fn scalar(&self, name: &str) -> Result<Option<f32>> {
        if !self.contains(name) {
            return Ok(None);
        }
        let t = self.get(name)?;
        let v = to_f32(&t)?;
        if v.len() != 1 {
            return Err(EngineError::Other(format!(
                "{name}: expected a scalar, found {} elements",
                v.len()
            )));
        }
        Ok(Some(v[0]))
    }

    /// A 1-D float vector of length n (norm weights, biases) as f32.
    pub fn vector(&self, name: &str, n: usize) -> Result<Vec<f32>> {
        let t = self.expect(name, &[n])?;
        to_f32(&t)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn e4m3_rounding_is_nearest_even_and_saturates() {
        // Every code round-trips.
        for b in 0u8..=0xFE {
            if b & 0x7F == 0x7F {
                continue;
            }
            let v = e4m3_to_f32(b);
            let back = f32_to_e4m3(v);
            assert_eq!(e4m3_to_f32(back), v, "code {b:#x}");
        }
        // Midpoints between neighbours go to the even code; just off a midpoint goes to the nearer.
        assert_eq!(f32_to_e4m3(1.0625), 0x38); // between 1.0 (0x38) and 1.125 (0x39): even 0x38
        assert_eq!(f32_to_e4m3(1.1875), 0x3A); // between 1.125 (0x39) and 1.25 (0x3A): even 0x3A
        assert_eq!(f32_to_e4m3(1.07), 0x39);
        assert_eq!(f32_to_e4m3(-1.0625), 0xB8);
        // Subnormals: 2^-10 is halfway between 0 and 2^-9 (ties to even: 0).
        assert_eq!(f32_to_e4m3(2f32.powi(-10)), 0x00);
        assert_eq!(f32_to_e4m3(1.5 * 2f32.powi(-9)), 0x02);
        // Saturation.
        assert_eq!(f32_to_e4m3(1e6), 0x7E);
        assert_eq!(f32_to_e4m3(-500.0), 0xFE);
        assert_eq!(f32_to_e4m3(460.0), 0x7E);
        assert_eq!(fp8_kv_round(3.0, 0.5), 3.0);
        assert_eq!(fp8_kv_round(1.0625 * 0.25, 0.25), 0.25);
    }

    #[test]
    fn e4m3_known_values() {
        // Independent values of the OCP E4M3FN format.
        assert_eq!(e4m3_to_f32(0x00), 0.0);
        assert_eq!(e4m3_to_f32(0x38), 1.0); // exp 7, man 0
        assert_eq!(e4m3_to_f32(0x7E), 448.0); // max normal
        assert_eq!(e4m3_to_f32(0x01), 2f32.powi(-9)); // min subnormal
        assert_eq!(e4m3_to_f32(0xB8), -1.0);
        assert_eq!(e4m3_to_f32(0x3C), 1.5);
        assert!(e4m3_to_f32(0x7F).is_nan());
    }

    #[test]
    fn nvfp4_nibble_order_and_scales() {
        // One row, 16 columns: byte j holds column 2j (low) and 2j+1 (high).
        let mut packed = vec![0u8; 8];
        packed[0] = 0x2 | (0x9 << 4); // col0 = 1.0, col1 = -0.5
        packed[7] = 0x7 | (0xF << 4); // col14 = 6.0, col15 = -6.0
        let scale = vec![0x40u8]; // 2.0
        let w = dequant_nvfp4(&packed, &scale, 4.0, 1, 16);
        assert_eq!(w[0], 0.5);
        assert_eq!(w[1], -0.25);
        assert_eq!(w[14], 3.0);
        assert_eq!(w[15], -3.0);
        assert!(w[2..14].iter().all(|&x| x == 0.0));
    }
}
