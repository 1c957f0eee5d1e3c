//! Reads a safetensors header (without mapping the data) and checks that every tensor's byte range
//! matches its dtype and shape, stays inside the file, and that ranges tile the data region.
use std::collections::BTreeMap;
use std::io::Read;
use std::path::Path;

#[derive(Debug, Clone)]
pub struct HeaderTensor {
    pub dtype: String,
    pub shape: Vec<usize>,
    pub start: u64,
    pub end: u64,
}

#[derive(Debug, Clone, Default)]
pub struct Header {
    pub tensors: BTreeMap<String, HeaderTensor>,
    /// Bytes of tensor data the header describes (max end offset).
    pub data_bytes: u64,
}

/// Bits per element of a safetensors dtype name.
pub fn dtype_bits(d: &str) -> Option<u64> {
    Some(match d {
        "BOOL" | "U8" | "I8" | "F8_E4M3" | "F8_E5M2" | "F8_E8M0" => 8,
        "F4" => 4,
        "F6_E2M3" | "F6_E3M2" => 6,
        "I16" | "U16" | "F16" | "BF16" => 16,
        "I32" | "U32" | "F32" => 32,
        "I64" | "U64" | "F64" | "C64" => 64,
        _ => return None,
    })
}

/// Parse and check the header of `path`. `Err` holds every problem found (one per line).
pub fn read(path: &Path) -> Result<Header, Vec<String>> {
    let mut f = std::fs::File::open(path).map_err(|e| vec![format!("cannot open: {e}")])?;
    let file_len = f.metadata().map_err(|e| vec![e.to_string()])?.len();
    if file_len < 8 {
        return Err(vec![format!(
            "only {file_len} bytes: not a safetensors file (truncated?); re-run `laguna fetch`"
        )]);
    }
    let mut n8 = [0u8; 8];
    f.read_exact(&mut n8).map_err(|e| vec![e.to_string()])?;
    let n = u64::from_le_bytes(n8);
    if n > 100 << 20 || 8 + n > file_len {
        return Err(vec![format!(
            "header length field says {n} bytes but the file has {file_len}: truncated or not safetensors; re-run `laguna fetch`"
        )]);
    }
    let mut buf = vec![0u8; n as usize];
    f.read_exact(&mut buf).map_err(|e| vec![e.to_string()])?;
    let v: serde_json::Value = serde_json::from_slice(&buf).map_err(|e| {
        vec![format!(
            "header is not valid JSON ({e}): the file is corrupt; re-run `laguna fetch`"
        )]
    })?;
    let obj = v
        .as_object()
        .ok_or_else(|| vec!["header is not a JSON object".to_string()])?;
    let data_len = file_len - 8 - n;
    let mut problems = vec![];
    let mut h = Header::default();
    for (name, t) in obj {
        if name == "__metadata__" {
            continue;
        }
        let dtype = t
            .get("dtype")
            .and_then(|d| d.as_str())
            .unwrap_or("")
            .to_string();
        let shape: Option<Vec<usize>> = t
            .get("shape")
            .and_then(|s| s.as_array())
            .and_then(|a| a.iter().map(|x| x.as_u64().map(|x| x as usize)).collect());
        let offs: Option<Vec<u64>> = t
            .get("data_offsets")
            .and_then(|s| s.as_array())
            .and_then(|a| a.iter().map(|x| x.as_u64()).collect());
        let (Some(shape), Some(offs)) = (shape, offs) else {
            problems.push(format!(
                "tensor `{name}`: header entry lacks a valid shape or data_offsets"
            ));
            continue;
        };
        if offs.len() != 2 || offs[1] < offs[0] {
            problems.push(format!("tensor `{name}`: bad data_offsets {offs:?}"));
            continue;
        }
        let Some(bits) = dtype_bits(&dtype) else {
            problems.push(format!("tensor `{name}`: unknown dtype `{dtype}`"));
            continue;
        };
        let numel: u64 = shape.iter().map(|&d| d as u64).product();
        let want = (numel * bits).div_ceil(8);
        if offs[1] - offs[0] != want {
            problems.push(format!("tensor `{name}`: {dtype} {shape:?} needs {want} bytes but its data_offsets span {}", offs[1] - offs[0]));
        }
        if offs[1] > data_len {
            problems.push(format!(
                "tensor `{name}` ends at data byte {} but the file holds only {data_len} data bytes: truncated; re-run `laguna fetch`",
                offs[1]
            ));
        }
        h.data_bytes = h.data_bytes.max(offs[1]);
        h.tensors.insert(
            name.clone(),
            HeaderTensor {
                dtype,
                shape,
                start: offs[0],
                end: offs[1],
            },
        );
    }
    let mut ranges: Vec<(u64, u64, &String)> =
        h.tensors.iter().map(|(k, t)| (t.start, t.end, k)).collect();
    ranges.sort();
    let mut pos = 0;
    for (s, e, name) in ranges {
        if s != pos {
            problems.push(format!("tensor `{name}` starts at data byte {s}, expected {pos}: tensors overlap or leave a gap"));
            break;
        }
        pos = e;
    }
    if problems.is_empty() && data_len > h.data_bytes {
        problems.push(format!(
            "{} bytes after the last tensor: the file is larger than its header says",
            data_len - h.data_bytes
        ));
    }
    if problems.is_empty() {
        Ok(h)
    } else {
        Err(problems)
    }
}
