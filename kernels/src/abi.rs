//! The word ABI every kernel and every GPU executor shares, written once.
//!
//! * **Storage.** A buffer is an array of 32-bit words: f16 and bf16 pack
//!   two elements per word (the first in the low half), every other dtype
//!   takes one word per element (bool and u8 zero-extended).
//! * **Bindings.** Group 0 of every kernel binds, in order: the parameter
//!   words (binding 0), the output (binding 1), the bound operands (2..),
//!   then, for a kernel that checks its input, one status word. The
//!   parameters are `var<storage, read>`, in a buffer of their own (WGSL's
//!   uniformity analysis treats loads from writable storage as
//!   non-uniform, and kernels branch and synchronize on their
//!   parameters). Every other binding is `var<storage, read_write>`: a
//!   program binds sub-ranges of one arena buffer, and WebGPU's usage
//!   scopes forbid mixing read-only and writable bindings of one buffer in
//!   a dispatch; no two of those ranges overlap. A kernel that only reads
//!   a binding simply never writes it.
//! * **Status words.** A kernel that finds bad input (an index out of
//!   range) reports the first offending position `p` by raising its status
//!   word to `!p` with `atomicMax`; the word is cleared to zero before
//!   every call, so zero means "no bad input" ([`bad_input_position`]).
//!

use half::{bf16, f16};
use kiln::{DType, HostData};
use std::fmt::Write;

/// 32-bit words a buffer of `len` elements of `dtype` occupies: f16 and
/// bf16 pack two per word, every other dtype takes one word per element.
///
/// ```
/// assert_eq!(kiln_kernels::words(kiln::DType::BF16, 5), 3);
/// assert_eq!(kiln_kernels::words(kiln::DType::U8, 5), 5);
/// ```
pub fn words(dtype: DType, len: usize) -> usize {
    if matches!(dtype, DType::F16 | DType::BF16) {
        len.div_ceil(2)
    } else {
        len
    }
}

/// Bytes one element takes in storage, for slot sizes: 2 for the packed
/// f16 and bf16, 4 for every other dtype (see [`words`]).
pub fn element_bytes(dtype: DType) -> usize {
    if matches!(dtype, DType::F16 | DType::BF16) {
        2
    } else {
        4
    }
}

/// Bytes of storage holding `len` elements of `dtype`: whole words, at
/// least one (no API binds an empty buffer).
pub fn storage_bytes(dtype: DType, len: usize) -> u64 {
    (words(dtype, len).max(1) as u64) * 4
}

/// The words of `data` as the kernels read them.
pub fn to_words(data: &HostData) -> Vec<u32> {
    fn pairs(bits: impl ExactSizeIterator<Item = u16>) -> Vec<u32> {
        let mut words = Vec::with_capacity(bits.len().div_ceil(2));
        let mut bits = bits.peekable();
        while let Some(low) = bits.next() {
            let high = bits.next().unwrap_or(0);
            words.push(u32::from(low) | (u32::from(high) << 16));
        }
        words
    }
    match data {
        HostData::F32(v) => v.iter().map(|x| x.to_bits()).collect(),
        HostData::I32(v) => v.iter().map(|&x| x as u32).collect(),
        HostData::U32(v) => v.clone(),
        HostData::Bool(v) => v.iter().map(|&x| u32::from(x)).collect(),
        HostData::U8(v) => v.iter().map(|&x| u32::from(x)).collect(),
        HostData::F16(v) => pairs(v.iter().map(|x| x.to_bits())),
        HostData::BF16(v) => pairs(v.iter().map(|x| x.to_bits())),
    }
}

/// `len` elements of `dtype` from the words the kernels wrote.
pub fn from_words(dtype: DType, len: usize, words: &[u32]) -> HostData {
    let halves = || {
        words
            .iter()
            .flat_map(|&w| [w as u16, (w >> 16) as u16])
            .take(len)
    };
    let words = &words[..len.min(words.len())];
    match dtype {
        DType::F32 => HostData::F32(words.iter().map(|&w| f32::from_bits(w)).collect()),
        DType::I32 => HostData::I32(words.iter().map(|&w| w as i32).collect()),
        DType::U32 => HostData::U32(words.to_vec()),
        DType::Bool => HostData::Bool(words.iter().map(|&w| w != 0).collect()),
        DType::U8 => HostData::U8(words.iter().map(|&w| w as u8).collect()),
        DType::F16 => HostData::F16(halves().map(f16::from_bits).collect()),
        DType::BF16 => HostData::BF16(halves().map(bf16::from_bits).collect()),
    }
}

/// The binding declarations of the parameters, an output array of `out`
/// elements and the operands in `bound` as (operand, element type):
/// operand `k` is named `in_k`, bound at 2.. in the order of `bound`.
pub(crate) fn bindings(bound: &[(usize, &str)], out: &str) -> String {
    let mut s = format!(
        "@group(0) @binding(0) var<storage, read> params: array<u32>;\n\
         @group(0) @binding(1) var<storage, read_write> out: array<{out}>;\n"
    );
    for (b, (k, element)) in bound.iter().enumerate() {
        let _ = writeln!(
            s,
            "@group(0) @binding({}) var<storage, read_write> in_{k}: array<{element}>;",
            b + 2
        );
    }
    s
}

/// The status word at `binding` and `report_bad_input(p)`, which records
/// position `p` unless an earlier position was already recorded.
pub(crate) fn status_binding(binding: usize) -> String {
    format!(
        "@group(0) @binding({binding}) var<storage, read_write> status: array<atomic<u32>>;\n\
         fn report_bad_input(position: u32) {{\n    atomicMax(&status[0], ~position);\n}}\n"
    )
}

/// The first offending position a read-back status word records, or
/// `None` when the kernels found no bad input.
///
/// ```
/// assert_eq!(kiln_kernels::bad_input_position(0), None);
/// assert_eq!(kiln_kernels::bad_input_position(!7), Some(7));
/// ```
pub fn bad_input_position(word: u32) -> Option<u32> {
    (word != 0).then_some(!word)
}

/// `source` with every storage binding declared `read_write`: user kernels
/// declare their inputs `var<storage, read>` (or `var<storage>`), and a
/// program binds them beside writable ranges of the same arena buffer.
/// Only the address-space brackets change; the result is validated again
/// by whoever compiles it.
pub fn writable_bindings(source: &str) -> String {
    let mut out = String::with_capacity(source.len() + 64);
    let mut rest = source;
    while let Some(at) = rest.find("var<") {
        out.push_str(&rest[..at]);
        let after = &rest[at + 4..];
        match after.find('>') {
            Some(close) if is_read_only_storage(&after[..close]) && !declares_params(&out) => {
                out.push_str("var<storage, read_write>");
                rest = &after[close + 1..];
            }
            _ => {
                out.push_str("var<");
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out
}

/// True when the declaration `text` ends in is binding 0, the parameters:
/// the attributes since the previous statement name `@binding(0)`.
fn declares_params(text: &str) -> bool {
    let start = text.rfind([';', '}']).map_or(0, |i| i + 1);
    let attributes: String = text[start..].split_whitespace().collect();
    attributes.contains("@binding(0)")
}

/// True for the inside of `var<…>` naming a read-only storage buffer:
/// `storage` alone or `storage, read`.
fn is_read_only_storage(inside: &str) -> bool {
    let mut parts = inside.split(',').map(str::trim);
    matches!(
        (parts.next(), parts.next(), parts.next()),
        (Some("storage"), None | Some("read"), None)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_dtype_survives_the_word_layout() {
        let cases = [
            HostData::F32(vec![1.5, -0.0, f32::NAN, f32::INFINITY]),
            HostData::I32(vec![i32::MIN, -1, 0, 7]),
            HostData::U32(vec![u32::MAX, 0, 3]),
            HostData::Bool(vec![true, false, true]),
            HostData::U8(vec![0, 255, 17]),
            HostData::F16(vec![
                f16::from_f32(1.5),
                f16::NEG_INFINITY,
                f16::from_f32(-2.0),
            ]),
            HostData::BF16(vec![bf16::from_f32(3.25), bf16::from_f32(-7.0)]),
        ];
        for data in cases {
            let words = to_words(&data);
            assert_eq!(words.len(), super::words(data.dtype(), data.len()));
            let back = from_words(data.dtype(), data.len(), &words);
            assert_eq!(format!("{back:?}"), format!("{data:?}"));
        }
    }

    #[test]
    fn read_only_storage_bindings_but_the_parameters_become_writable_and_nothing_else_changes() {
        let source = "@group(0) @binding(0) var<storage, read> params: array<u32>;\n\
                      @group(0) @binding(1) var<storage, read_write> out: array<f32>;\n\
                      @group(0) @binding(2) var<storage,read> x: array<f32>;\n\
                      @group(0) @binding(3) var<storage> y: array<f32>;\n\
                      var<workgroup> tile: array<f32, 64>;\n\
                      var<private> seed: u32;\n";
        let widened = writable_bindings(source);
        assert_eq!(widened.matches("var<storage, read_write>").count(), 3);
        assert!(widened.contains("@binding(0) var<storage, read> params"));
        assert!(widened.contains("var<workgroup> tile"));
        assert!(widened.contains("var<private> seed"));
        assert_eq!(widened.matches("read>").count(), 1);
    }

    #[test]
    fn a_cleared_status_word_reports_nothing_and_the_lowest_position_wins() {
        let report = |word: u32, position: u32| word.max(!position);
        let word = [9, 3, 12].into_iter().fold(0, report);
        assert_eq!(bad_input_position(word), Some(3));
        assert_eq!(bad_input_position(0), None);
    }
}
