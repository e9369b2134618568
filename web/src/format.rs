//! Arrays printed the way NumPy prints them: `array([[1., 2.], [3., 4.]],
//! dtype=float32)`, aligned, wrapped at 75 columns, and summarized with
//! `...` past 1,000 elements.

use kiln::{Array, DType, Result};

/// More elements than this are summarized (NumPy's `threshold`).
const THRESHOLD: usize = 1000;
/// Elements kept at each end of a summarized axis (NumPy's `edgeitems`).
const EDGE_ITEMS: usize = 3;
/// Lines are wrapped at this width (NumPy's `linewidth`).
const LINE_WIDTH: usize = 75;

/// The NumPy `repr` of `array`, evaluating it if needed.
///
/// ```
/// use kiln::Array;
/// let a = Array::from_vec(vec![1.0f32, 2.5, 3.0, 4.0], &[2, 2])?;
/// assert_eq!(
///     kiln_web::format::numpy_repr(&a)?,
///     "array([[1. , 2.5],\n       [3. , 4. ]], dtype=float32)"
/// );
/// # Ok::<(), kiln::Error>(())
/// ```
pub fn numpy_repr(array: &Array) -> Result<String> {
    let data = array.data()?;
    let dims = array.dims().unwrap_or_default();
    let values = data.to_f64_vec();
    let dtype = array.dtype();
    let prefix = "array(";
    let suffix = format!(", dtype={})", numpy_dtype(dtype));
    let summarize = values.len() > THRESHOLD;
    let shown = shown_indices(&dims, summarize);
    let cells = format_cells(&shown.iter().map(|&i| values[i]).collect::<Vec<_>>(), dtype);
    let mut cells = cells.into_iter();
    let body = render(&dims, 0, summarize, prefix.len(), &mut cells);
    Ok(format!("{prefix}{body}{suffix}"))
}

/// NumPy's name for a dtype.
pub fn numpy_dtype(dtype: DType) -> &'static str {
    match dtype {
        DType::F32 => "float32",
        DType::F16 => "float16",
        DType::BF16 => "bfloat16",
        DType::I32 => "int32",
        DType::U32 => "uint32",
        DType::Bool => "bool",
        DType::U8 => "uint8",
    }
}

/// The flat indices of the elements printed, in printing order.
fn shown_indices(dims: &[usize], summarize: bool) -> Vec<usize> {
    let mut out = Vec::new();
    let strides: Vec<usize> = (0..dims.len())
        .map(|d| dims[d + 1..].iter().product())
        .collect();
    fn walk(
        dims: &[usize],
        strides: &[usize],
        d: usize,
        base: usize,
        summarize: bool,
        out: &mut Vec<usize>,
    ) {
        if d == dims.len() {
            out.push(base);
            return;
        }
        for i in axis_indices(dims[d], summarize) {
            walk(dims, strides, d + 1, base + i * strides[d], summarize, out);
        }
    }
    walk(dims, &strides, 0, 0, summarize, &mut out);
    out
}

/// The indices of an axis of length `n` that are printed.
fn axis_indices(n: usize, summarize: bool) -> Vec<usize> {
    if summarize && n > 2 * EDGE_ITEMS {
        (0..EDGE_ITEMS).chain(n - EDGE_ITEMS..n).collect()
    } else {
        (0..n).collect()
    }
}

/// Formats every printed element to one common width, as NumPy aligns them.
fn format_cells(values: &[f64], dtype: DType) -> Vec<String> {
    let raw: Vec<String> = match dtype {
        DType::Bool => values
            .iter()
            .map(|&v| if v != 0.0 { "True" } else { "False" }.to_string())
            .collect(),
        d if d.is_float() => format_floats(values),
        _ => values.iter().map(|v| format!("{v}")).collect(),
    };
    if dtype.is_float() && raw.iter().all(|s| s.contains('.') && !s.contains('e')) {
        // Align the decimal points: integer parts padded on the left,
        // fractions on the right.
        let split: Vec<(&str, &str)> = raw
            .iter()
            .map(|s| s.split_once('.').unwrap_or((s, "")))
            .collect();
        let int_width = split.iter().map(|(i, _)| i.len()).max().unwrap_or(0);
        let frac_width = split.iter().map(|(_, f)| f.len()).max().unwrap_or(0);
        return split
            .iter()
            .map(|(i, f)| format!("{i:>int_width$}.{f:<frac_width$}"))
            .collect();
    }
    let width = raw.iter().map(String::len).max().unwrap_or(0);
    raw.iter().map(|s| format!("{s:>width$}")).collect()
}

/// Floats in NumPy's style: `1.` for whole numbers, the shortest f32 digits
/// otherwise, scientific when magnitudes are very large or very small.
fn format_floats(values: &[f64]) -> Vec<String> {
    let finite = values
        .iter()
        .copied()
        .filter(|v| v.is_finite() && *v != 0.0);
    let (min, max) = finite.fold((f64::INFINITY, 0.0f64), |(lo, hi), v| {
        (lo.min(v.abs()), hi.max(v.abs()))
    });
    let scientific = max >= 1e8 || (min < 1e-4 && max > 0.0);
    values
        .iter()
        .map(|&v| {
            if v.is_nan() {
                "nan".to_string()
            } else if v.is_infinite() {
                if v > 0.0 { "inf" } else { "-inf" }.to_string()
            } else if scientific {
                scientific_text(v)
            } else if v.fract() == 0.0 {
                format!("{}.", v as f32)
            } else {
                format!("{}", v as f32)
            }
        })
        .collect()
}

/// `1.0000e-06`: NumPy writes the exponent signed, with two digits at least.
fn scientific_text(v: f64) -> String {
    let text = format!("{:.4e}", v as f32);
    match text.split_once('e') {
        Some((mantissa, exponent)) => {
            let (sign, digits) = match exponent.strip_prefix('-') {
                Some(digits) => ('-', digits),
                None => ('+', exponent),
            };
            format!("{mantissa}e{sign}{digits:0>2}")
        }
        None => text,
    }
}

/// Renders axis `d` onward; `column` is where the opening bracket sits.
fn render(
    dims: &[usize],
    d: usize,
    summarize: bool,
    column: usize,
    cells: &mut impl Iterator<Item = String>,
) -> String {
    if dims.is_empty() {
        return cells.next().unwrap_or_default();
    }
    let n = dims[d];
    let shown = axis_indices(n, summarize);
    let elided = shown.len() < n;
    let mut parts: Vec<String> = Vec::with_capacity(shown.len() + 1);
    for (k, _) in shown.iter().enumerate() {
        if elided && k == EDGE_ITEMS {
            parts.push("...".to_string());
        }
        parts.push(if d + 1 == dims.len() {
            cells.next().unwrap_or_default()
        } else {
            render(dims, d + 1, summarize, column + 1, cells)
        });
    }
    let indent = " ".repeat(column + 1);
    if d + 1 == dims.len() {
        return format!("[{}]", wrap_row(&parts, column + 1, &indent));
    }
    let separator = format!(",{}{indent}", "\n".repeat(dims.len() - d - 1));
    format!("[{}]", parts.join(&separator))
}

/// Joins a row's cells with `, `, breaking lines past [`LINE_WIDTH`].
fn wrap_row(parts: &[String], start: usize, indent: &str) -> String {
    let mut out = String::new();
    let mut column = start;
    for (k, part) in parts.iter().enumerate() {
        if k > 0 {
            if column + 2 + part.len() + 1 > LINE_WIDTH {
                out.push_str(",\n");
                out.push_str(indent);
                column = indent.len();
            } else {
                out.push_str(", ");
                column += 2;
            }
        }
        out.push_str(part);
        column += part.len();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f32s(values: Vec<f32>, shape: &[usize]) -> Array {
        Array::from_vec(values, shape).unwrap()
    }

    #[test]
    fn whole_floats_print_with_a_trailing_point() {
        let a = f32s(vec![1.0, 2.0, 3.0], &[3]);
        assert_eq!(
            numpy_repr(&a).unwrap(),
            "array([1., 2., 3.], dtype=float32)"
        );
    }

    #[test]
    fn a_scalar_prints_without_brackets() {
        let a = Array::scalar(0.5, DType::F32);
        assert_eq!(numpy_repr(&a).unwrap(), "array(0.5, dtype=float32)");
    }

    #[test]
    fn integers_and_booleans_right_align() {
        let a = Array::from_vec(vec![1i32, -20, 300], &[3]).unwrap();
        assert_eq!(
            numpy_repr(&a).unwrap(),
            "array([  1, -20, 300], dtype=int32)"
        );
        let b = a.greater(0.0);
        assert_eq!(
            numpy_repr(&b).unwrap(),
            "array([ True, False,  True], dtype=bool)"
        );
    }

    #[test]
    fn three_dimensional_arrays_separate_blocks_by_a_blank_line() {
        let a = f32s((0..8).map(|v| v as f32).collect(), &[2, 2, 2]);
        assert_eq!(
            numpy_repr(&a).unwrap(),
            "array([[[0., 1.],\n        [2., 3.]],\n\n       [[4., 5.],\n        [6., 7.]]], dtype=float32)"
        );
    }

    #[test]
    fn more_than_a_thousand_elements_are_summarized() {
        let a = f32s((0..2000).map(|v| v as f32).collect(), &[2000]);
        assert_eq!(
            numpy_repr(&a).unwrap(),
            "array([   0.,    1.,    2., ..., 1997., 1998., 1999.], dtype=float32)"
        );
    }

    #[test]
    fn long_rows_wrap_under_the_first_element() {
        let a = f32s((0..30).map(|v| v as f32).collect(), &[30]);
        let text = numpy_repr(&a).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines.len() > 1, "{text}");
        assert!(lines.iter().all(|l| l.len() <= LINE_WIDTH), "{text}");
        assert!(lines[1].starts_with("       "), "{text}");
    }

    #[test]
    fn tiny_magnitudes_switch_to_scientific() {
        let a = f32s(vec![1e-6, 1.0], &[2]);
        assert_eq!(
            numpy_repr(&a).unwrap(),
            "array([1.0000e-06, 1.0000e+00], dtype=float32)"
        );
    }
}
