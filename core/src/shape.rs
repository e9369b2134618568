//! Shapes whose dimensions are known sizes or symbolic expressions.
//!
//! A shapeless compile gives every input axis a symbol (`s0`, `s1`, ...).
//! Shape rules combine them into [`SymExpr`]s kept in a canonical form
//! (a sum of integer-weighted products of atoms), so two dims are *provably*
//! equal exactly when their canonical forms are equal.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

/// A symbolic dimension variable.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Symbol(pub u32);

impl fmt::Display for Symbol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "s{}", self.0)
    }
}

/// A factor of a product in a [`SymExpr`].
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Atom {
    /// A symbol.
    Sym(Symbol),
    /// `floor(expr / divisor)` that could not be simplified.
    FloorDiv(Box<SymExpr>, u64),
}

/// A product of atoms, sorted; the empty product is the constant 1.
type Monomial = Vec<Atom>;

/// A canonical integer polynomial over atoms.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, Default)]
pub struct SymExpr {
    terms: BTreeMap<Monomial, i64>,
}

impl SymExpr {
    /// The constant `value`.
    pub fn constant(value: i64) -> Self {
        let mut terms = BTreeMap::new();
        if value != 0 {
            terms.insert(Vec::new(), value);
        }
        SymExpr { terms }
    }

    /// The bare symbol `s`.
    pub fn symbol(s: Symbol) -> Self {
        let mut terms = BTreeMap::new();
        terms.insert(vec![Atom::Sym(s)], 1);
        SymExpr { terms }
    }

    /// The value if the expression has no atoms.
    pub fn as_constant(&self) -> Option<i64> {
        match self.terms.len() {
            0 => Some(0),
            1 => self.terms.get(&Vec::new()).copied(),
            _ => None,
        }
    }

    /// `self + other`. Coefficients saturate instead of overflowing; the
    /// size checks of [`crate::limits`] reject any aval holding such a
    /// coefficient, so a saturated expression is never taken as a size.
    pub fn add(&self, other: &SymExpr) -> SymExpr {
        let mut terms = self.terms.clone();
        for (m, c) in &other.terms {
            let entry = terms.entry(m.clone()).or_insert(0);
            *entry = entry.saturating_add(*c);
            if *entry == 0 {
                terms.remove(m);
            }
        }
        SymExpr { terms }
    }

    /// `self * k`.
    pub fn scale(&self, k: i64) -> SymExpr {
        if k == 0 {
            return SymExpr::default();
        }
        SymExpr {
            terms: self
                .terms
                .iter()
                .map(|(m, c)| (m.clone(), c.saturating_mul(k)))
                .collect(),
        }
    }

    /// `self * other`.
    pub fn mul(&self, other: &SymExpr) -> SymExpr {
        let mut out = SymExpr::default();
        for (ma, ca) in &self.terms {
            for (mb, cb) in &other.terms {
                let mut m: Monomial = ma.iter().chain(mb.iter()).cloned().collect();
                m.sort();
                let mut single = BTreeMap::new();
                single.insert(m, ca.saturating_mul(*cb));
                out = out.add(&SymExpr { terms: single });
            }
        }
        out
    }

    /// `floor(self / divisor)`; exact when every coefficient is divisible.
    pub fn floor_div(&self, divisor: u64) -> SymExpr {
        // No size reaches i64::MAX, so a larger divisor floors every size to 0
        // exactly as i64::MAX does.
        let d = i64::try_from(divisor).unwrap_or(i64::MAX).max(1);
        if d == 1 {
            return self.clone();
        }
        if let Some(c) = self.as_constant() {
            return SymExpr::constant(c.div_euclid(d));
        }
        if self.terms.values().all(|c| c % d == 0) {
            return SymExpr {
                terms: self.terms.iter().map(|(m, c)| (m.clone(), c / d)).collect(),
            };
        }
        // floor((floor(e/a) + c)/d) = floor((e + c·a)/(a·d)) for integers
        // and positive a, d: chains of strided slices stay one level deep.
        if let Some((inner, a, c)) = self.offset_floor_div() {
            if let Some(ad) = a.checked_mul(d.unsigned_abs()) {
                let offset = SymExpr::constant(c.saturating_mul(a as i64));
                return inner.add(&offset).floor_div(ad);
            }
        }
        let mut terms = BTreeMap::new();
        terms.insert(
            vec![Atom::FloorDiv(Box::new(self.clone()), d.unsigned_abs())],
            1,
        );
        SymExpr { terms }
    }

    /// `(e, a, c)` when the expression is `floor(e/a) + c`.
    fn offset_floor_div(&self) -> Option<(&SymExpr, u64, i64)> {
        let mut floor_div = None;
        let mut constant = 0;
        for (monomial, &coefficient) in &self.terms {
            match monomial.as_slice() {
                [] => constant = coefficient,
                [Atom::FloorDiv(e, a)] if coefficient == 1 && floor_div.is_none() => {
                    floor_div = Some((&**e, *a));
                }
                _ => return None,
            }
        }
        floor_div.map(|(e, a)| (e, a, constant))
    }

    /// How deeply floor divisions nest in the expression (0 for none). Size
    /// checks bound it, so walking an expression never recurses deeply.
    pub fn depth(&self) -> usize {
        self.terms
            .keys()
            .flatten()
            .map(|atom| match atom {
                Atom::Sym(_) => 0,
                Atom::FloorDiv(e, _) => 1 + e.depth(),
            })
            .max()
            .unwrap_or(0)
    }

    /// The largest coefficient magnitude (constant term included). Size
    /// checks bound it, so an expression whose arithmetic saturated (see
    /// [`SymExpr::add`]) never reaches an aval.
    pub fn max_coefficient(&self) -> u64 {
        self.terms
            .values()
            .map(|c| c.unsigned_abs())
            .max()
            .unwrap_or(0)
    }

    /// Evaluates under `bind`, which gives each symbol's size.
    pub fn eval(&self, bind: &dyn Fn(Symbol) -> Option<i64>) -> Option<i64> {
        let mut total = 0i64;
        for (m, c) in &self.terms {
            let mut prod = *c;
            for atom in m {
                let v = match atom {
                    Atom::Sym(s) => bind(*s)?,
                    Atom::FloorDiv(e, d) => e
                        .eval(bind)?
                        .div_euclid(i64::try_from(*d).unwrap_or(i64::MAX).max(1)),
                };
                prod = prod.checked_mul(v)?;
            }
            total = total.checked_add(prod)?;
        }
        Some(total)
    }

    /// The expression with every symbol replaced by `value(symbol)`, put
    /// back in canonical form (floor divisions simplify where they can).
    pub fn substitute(&self, value: &dyn Fn(Symbol) -> SymExpr) -> SymExpr {
        let mut out = SymExpr::default();
        for (monomial, &coefficient) in &self.terms {
            let mut product = SymExpr::constant(coefficient);
            for atom in monomial {
                let factor = match atom {
                    Atom::Sym(s) => value(*s),
                    Atom::FloorDiv(e, d) => e.substitute(value).floor_div(*d),
                };
                product = product.mul(&factor);
            }
            out = out.add(&product);
        }
        out
    }

    /// The terms: each product of atoms with its coefficient.
    pub(crate) fn terms(&self) -> impl Iterator<Item = (&[Atom], i64)> {
        self.terms.iter().map(|(m, &c)| (m.as_slice(), c))
    }

    /// Every symbol the expression mentions.
    pub fn symbols(&self, out: &mut Vec<Symbol>) {
        for m in self.terms.keys() {
            for atom in m {
                match atom {
                    Atom::Sym(s) => out.push(*s),
                    Atom::FloorDiv(e, _) => e.symbols(out),
                }
            }
        }
    }
}

impl fmt::Display for SymExpr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.terms.is_empty() {
            return f.write_str("0");
        }
        // Constant last: `s0*s1+3`, not `3+s0*s1`.
        let mut first = true;
        let ordered = self
            .terms
            .iter()
            .filter(|(m, _)| !m.is_empty())
            .chain(self.terms.iter().filter(|(m, _)| m.is_empty()));
        for (m, c) in ordered {
            let (sign, mag) = if *c < 0 { ("-", -c) } else { ("+", *c) };
            if first {
                if sign == "-" {
                    f.write_str("-")?;
                }
            } else {
                f.write_str(sign)?;
            }
            first = false;
            let mut parts: Vec<String> = Vec::new();
            if mag != 1 || m.is_empty() {
                parts.push(mag.to_string());
            }
            for atom in m {
                parts.push(match atom {
                    Atom::Sym(s) => s.to_string(),
                    Atom::FloorDiv(e, d) => format!("({e})/{d}"),
                });
            }
            f.write_str(&parts.join("*"))?;
        }
        Ok(())
    }
}

/// One dimension of a shape.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Dim {
    /// A size known at trace time.
    Known(usize),
    /// A size that depends on the call (shapeless compile).
    Sym(Arc<SymExpr>),
}

impl Dim {
    /// The dim of a bare symbol.
    pub fn symbol(s: Symbol) -> Dim {
        Dim::Sym(Arc::new(SymExpr::symbol(s)))
    }

    /// The size, if known.
    pub fn known(&self) -> Option<usize> {
        match self {
            Dim::Known(n) => Some(*n),
            Dim::Sym(_) => None,
        }
    }

    /// The dim as an expression (constants included).
    pub fn to_expr(&self) -> SymExpr {
        match self {
            Dim::Known(n) => SymExpr::constant(i64::try_from(*n).unwrap_or(i64::MAX)),
            Dim::Sym(e) => (**e).clone(),
        }
    }

    /// The dim of an expression: `Known` when it is a non-negative constant.
    pub fn from_expr(e: SymExpr) -> Dim {
        match e.as_constant() {
            Some(c) if c >= 0 => Dim::Known(c as usize),
            _ => Dim::Sym(Arc::new(e)),
        }
    }

    /// `self + other`; a known sum saturates at `usize::MAX`, which every
    /// size check rejects.
    pub fn add(&self, other: &Dim) -> Dim {
        match (self, other) {
            (Dim::Known(a), Dim::Known(b)) => Dim::Known(a.saturating_add(*b)),
            _ => Dim::from_expr(self.to_expr().add(&other.to_expr())),
        }
    }

    /// `self * other`; a known product saturates at `usize::MAX`, which
    /// every size check rejects.
    pub fn mul(&self, other: &Dim) -> Dim {
        match (self, other) {
            (Dim::Known(a), Dim::Known(b)) => Dim::Known(a.saturating_mul(*b)),
            _ => Dim::from_expr(self.to_expr().mul(&other.to_expr())),
        }
    }

    /// True when the two dims are equal as written (same constant or same
    /// canonical expression). Inside a trace, dims a guard made equal are
    /// equal too: compare them with [`crate::symbolic::dims_equal`], which
    /// knows the trace's guards.
    pub fn provably_eq(&self, other: &Dim) -> bool {
        self == other
    }

    /// Evaluates the dim under a symbol binding.
    pub fn eval(&self, bind: &dyn Fn(Symbol) -> Option<i64>) -> Option<usize> {
        match self {
            Dim::Known(n) => Some(*n),
            Dim::Sym(e) => e.eval(bind).and_then(|v| usize::try_from(v).ok()),
        }
    }
}

impl From<usize> for Dim {
    fn from(n: usize) -> Dim {
        Dim::Known(n)
    }
}

impl fmt::Display for Dim {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Dim::Known(n) => write!(f, "{n}"),
            Dim::Sym(e) => write!(f, "{e}"),
        }
    }
}

/// The dims of an array, outermost first.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, Default)]
#[serde(transparent)]
pub struct Shape(pub Vec<Dim>);

impl Shape {
    /// A shape of known sizes.
    pub fn known(dims: &[usize]) -> Shape {
        Shape(dims.iter().map(|&d| Dim::Known(d)).collect())
    }

    /// The scalar shape `[]`.
    pub fn scalar() -> Shape {
        Shape(Vec::new())
    }

    /// Number of dims.
    pub fn rank(&self) -> usize {
        self.0.len()
    }

    /// The dims.
    pub fn dims(&self) -> &[Dim] {
        &self.0
    }

    /// The sizes, when every dim is known.
    pub fn as_known(&self) -> Option<Vec<usize>> {
        self.0.iter().map(Dim::known).collect()
    }

    /// True when no dim is symbolic.
    pub fn is_known(&self) -> bool {
        self.0.iter().all(|d| d.known().is_some())
    }

    /// The element count as a dim.
    pub fn numel(&self) -> Dim {
        self.0.iter().fold(Dim::Known(1), |acc, d| acc.mul(d))
    }

    /// The element count when known (saturating at `usize::MAX`, which
    /// every size check rejects).
    pub fn numel_known(&self) -> Option<usize> {
        self.0
            .iter()
            .try_fold(1usize, |acc, d| Some(acc.saturating_mul(d.known()?)))
    }

    /// Evaluates every dim under a symbol binding.
    pub fn eval(&self, bind: &dyn Fn(Symbol) -> Option<i64>) -> Option<Vec<usize>> {
        self.0.iter().map(|d| d.eval(bind)).collect()
    }
}

/// Row-major strides (in elements) of a contiguous array of concrete
/// `shape`; a product past `usize::MAX` saturates (such an array cannot
/// exist, and the strides are never used to address it).
///
/// ```
/// assert_eq!(kiln::shape::row_major_strides(&[2, 3, 4]), vec![12, 4, 1]);
/// ```
pub fn row_major_strides(shape: &[usize]) -> Vec<usize> {
    let mut strides = vec![0; shape.len()];
    let mut acc = 1usize;
    for (s, &d) in strides.iter_mut().zip(shape).rev() {
        *s = acc;
        acc = acc.saturating_mul(d);
    }
    strides
}

/// Strides that read a contiguous array of `in_shape` as if it had the
/// broadcast `out_shape` (NumPy rules): shapes align on the right, and
/// missing or size-1 input dims get stride 0.
///
/// ```
/// assert_eq!(kiln::shape::broadcast_strides(&[3, 1], &[2, 3, 4]), vec![0, 1, 0]);
/// ```
pub fn broadcast_strides(in_shape: &[usize], out_shape: &[usize]) -> Vec<usize> {
    let lead = out_shape.len().saturating_sub(in_shape.len());
    let in_strides = row_major_strides(in_shape);
    (0..out_shape.len())
        .map(|i| match i.checked_sub(lead) {
            Some(j) if in_shape[j] != 1 => in_strides[j],
            _ => 0,
        })
        .collect()
}

/// The NumPy broadcast of concrete `shapes` that the shape rules already
/// found compatible: per aligned axis, the size other than 1, else 1.
///
/// ```
/// assert_eq!(kiln::shape::broadcast_shape(&[&[3, 1], &[2, 1, 4]]), vec![2, 3, 4]);
/// ```
pub fn broadcast_shape(shapes: &[&[usize]]) -> Vec<usize> {
    let rank = shapes.iter().map(|s| s.len()).max().unwrap_or(0);
    (0..rank)
        .map(|d| {
            shapes
                .iter()
                .filter_map(|s| s.len().checked_sub(rank - d).map(|i| s[i]))
                .find(|&n| n != 1)
                .unwrap_or(1)
        })
        .collect()
}

impl From<&[usize]> for Shape {
    fn from(dims: &[usize]) -> Shape {
        Shape::known(dims)
    }
}

impl<const N: usize> From<[usize; N]> for Shape {
    fn from(dims: [usize; N]) -> Shape {
        Shape::known(&dims)
    }
}

/// Lets `x.pad_slice(axes, x.shape())` name another array's shape.
impl From<&Shape> for Shape {
    fn from(shape: &Shape) -> Shape {
        shape.clone()
    }
}

impl From<Vec<usize>> for Shape {
    fn from(dims: Vec<usize>) -> Shape {
        Shape::known(&dims)
    }
}

impl From<Vec<Dim>> for Shape {
    fn from(dims: Vec<Dim>) -> Shape {
        Shape(dims)
    }
}

impl fmt::Display for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[")?;
        for (i, d) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{d}")?;
        }
        f.write_str("]")
    }
}

/// Abstract value: what a shape rule knows about an array.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Aval {
    /// The shape.
    pub shape: Shape,
    /// The element type.
    pub dtype: crate::DType,
}

impl Aval {
    /// An aval from a shape and dtype.
    pub fn new(shape: impl Into<Shape>, dtype: crate::DType) -> Aval {
        Aval {
            shape: shape.into(),
            dtype,
        }
    }
}

impl fmt::Display for Aval {
    /// Renders like `f32[4,4]`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}{}", self.dtype, self.shape)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(i: u32) -> SymExpr {
        SymExpr::symbol(Symbol(i))
    }

    #[test]
    fn canonical_form_makes_commuted_sums_and_products_equal() {
        let a = s(0).add(&s(1)).mul(&s(2));
        let b = s(2).mul(&s(1)).add(&s(0).mul(&s(2)));
        assert_eq!(a, b);
        assert_eq!(a.to_string(), "s0*s2+s1*s2");
    }

    #[test]
    fn exact_division_simplifies_and_inexact_stays_an_atom() {
        let e = s(0).scale(4).add(&SymExpr::constant(8));
        assert_eq!(e.floor_div(4), s(0).add(&SymExpr::constant(2)));
        let odd = s(0).add(&SymExpr::constant(1)).floor_div(2);
        assert_eq!(odd.eval(&|_| Some(6)), Some(3));
        assert_eq!(odd.to_string(), "(s0+1)/2");
    }

    #[test]
    fn nested_floor_divisions_flatten_into_one() {
        // floor((floor((s0+1)/2) - 1)/3) = floor((s0 - 1)/6)
        let once = s(0).add(&SymExpr::constant(1)).floor_div(2);
        let twice = once.add(&SymExpr::constant(-1)).floor_div(3);
        assert_eq!(twice, s(0).add(&SymExpr::constant(-1)).floor_div(6));
        assert_eq!(twice.depth(), 1);
        for n in 0..40 {
            let direct = ((n + 1) / 2 - 1i64).div_euclid(3);
            assert_eq!(twice.eval(&|_| Some(n)), Some(direct), "s0 = {n}");
        }
    }

    #[test]
    fn subtraction_to_zero_yields_known_dim() {
        let d = Dim::from_expr(s(3).add(&s(3).scale(-1)));
        assert_eq!(d, Dim::Known(0));
    }

    #[test]
    fn aval_renders_dtype_then_shape() {
        let aval = Aval::new([4, 4], crate::DType::F32);
        assert_eq!(aval.to_string(), "f32[4,4]");
        let sym = Aval::new(
            Shape(vec![Dim::symbol(Symbol(0)), Dim::Known(3)]),
            crate::DType::F16,
        );
        assert_eq!(sym.to_string(), "f16[s0,3]");
    }
}
