//! Equality of symbolic dims under what a shapeless trace has assumed.
//!
//! A shape rule that needs two symbolic dims equal records the equality as
//! a guard (checked on every call) and goes on. From then on the trace may
//! rely on it: after `x * y` over `f32[s0]` and `f32[s1]`, a cotangent of
//! `f32[s0]` is a fine cotangent for `y`. [`DimFacts`] is the one place
//! that decides such questions, and every shape comparison under symbolic
//! dims goes through it (custom-op vjps, straight-through values, implicit
//! handlers, kernel and op shape rules through [`crate::ops::ShapeCx`],
//! fusion and the planner over a finished graph).
//!
//! Two dims are equal when the assumed equalities imply it:
//! * an equality between two symbols, or a symbol and a constant, merges
//!   them into one class, and every expression is rewritten with each
//!   symbol replaced by its class's representative (so `s0 == s1` also
//!   gives `s0*s2 == s1*s2`);
//! * any other equality `a == b` is kept as the linear fact `a - b = 0`
//!   over the expressions' products of atoms, and two dims are equal when
//!   their difference is a linear combination of those facts (Gaussian
//!   elimination, exact in integers). The divisibility guard a quantized
//!   shape rule records, `s0 == 32*((s0)/32)`, is such a fact, so
//!   `32*(s0)/32` and `s0` compare equal once it is known.
//!
//! The facts of the shapeless trace running on this thread are kept in a
//! scope ([`TraceScope`]) that the compile cache opens per trace; shape
//! rules and checks consult it through the free functions below, which
//! fall back to comparing as written when no scope is open.

use crate::shape::{Atom, Aval, Dim, Shape, SymExpr, Symbol};
use std::cell::RefCell;
use std::collections::BTreeMap;

/// A linear combination of products of atoms, with exact coefficients.
type Row = BTreeMap<Vec<Atom>, i128>;

/// The equalities a trace assumed about symbolic dims, and what follows
/// from them.
#[derive(Clone, Debug, Default)]
pub struct DimFacts {
    /// Every equality assumed, as written, with the op that assumed it.
    assumed: Vec<(String, Dim, Dim)>,
    /// Symbol classes: each symbol that was equated to another symbol or a
    /// constant, mapped to what replaces it (the class's smallest symbol,
    /// or its constant).
    classes: BTreeMap<Symbol, SymExpr>,
    /// The other equalities, rewritten by `classes`, as rows in echelon
    /// form: each row's pivot (its first product) appears in no later row.
    rows: Vec<Row>,
}

impl DimFacts {
    /// No facts: dims are equal only as written.
    pub fn new() -> DimFacts {
        DimFacts::default()
    }

    /// The facts of `equalities` (each with the op that assumed it).
    pub fn from_equalities<'a>(
        equalities: impl IntoIterator<Item = (&'a str, &'a Dim, &'a Dim)>,
    ) -> DimFacts {
        let mut facts = DimFacts::new();
        for (op, a, b) in equalities {
            facts.assume_equal(op, a, b);
        }
        facts
    }

    /// Every equality assumed so far, with the op that assumed it.
    pub fn assumed(&self) -> &[(String, Dim, Dim)] {
        &self.assumed
    }

    /// Assumes `a == b` (recorded by `op`); an equality that already
    /// follows from the facts adds nothing.
    pub fn assume_equal(&mut self, op: &str, a: &Dim, b: &Dim) {
        if self.dims_equal(a, b) {
            return;
        }
        self.assumed.push((op.to_string(), a.clone(), b.clone()));
        let (a, b) = (self.normalize(&a.to_expr()), self.normalize(&b.to_expr()));
        match (lone_symbol(&a), lone_symbol(&b)) {
            (Some(x), Some(y)) => self.merge(x.max(y), SymExpr::symbol(x.min(y))),
            (Some(x), None) if b.as_constant().is_some() => self.merge(x, b),
            (None, Some(y)) if a.as_constant().is_some() => self.merge(y, a),
            _ => self.add_row(difference(&a, &b)),
        }
    }

    /// True when `a == b` follows from the facts.
    pub fn dims_equal(&self, a: &Dim, b: &Dim) -> bool {
        match (a, b) {
            (Dim::Known(x), Dim::Known(y)) => x == y,
            _ if a == b => true,
            _ => {
                let (a, b) = (self.normalize(&a.to_expr()), self.normalize(&b.to_expr()));
                a == b
                    || self
                        .reduce(difference(&a, &b))
                        .is_some_and(|r| r.is_empty())
            }
        }
    }

    /// True when the shapes have the same rank and equal dims.
    pub fn shapes_equal(&self, a: &Shape, b: &Shape) -> bool {
        a.rank() == b.rank()
            && a.dims()
                .iter()
                .zip(b.dims())
                .all(|(x, y)| self.dims_equal(x, y))
    }

    /// True when the avals have the same dtype and equal shapes.
    pub fn avals_equal(&self, a: &Aval, b: &Aval) -> bool {
        a.dtype == b.dtype && self.shapes_equal(&a.shape, &b.shape)
    }

    /// `e` with every symbol replaced by its class's representative.
    fn normalize(&self, e: &SymExpr) -> SymExpr {
        if self.classes.is_empty() {
            return e.clone();
        }
        e.substitute(&|s| {
            self.classes
                .get(&s)
                .cloned()
                .unwrap_or_else(|| SymExpr::symbol(s))
        })
    }

    /// Replaces `replaced` (a class representative) by `target` (another
    /// representative, or a constant) in every class and every row.
    fn merge(&mut self, replaced: Symbol, target: SymExpr) {
        self.classes.insert(replaced, target);
        // Symbols that mapped to `replaced` now map through it, so each
        // symbol still maps straight to its representative.
        let classes = std::mem::take(&mut self.classes);
        let through = |t: Symbol| {
            classes
                .get(&t)
                .cloned()
                .unwrap_or_else(|| SymExpr::symbol(t))
        };
        self.classes = classes
            .iter()
            .map(|(&s, e)| (s, e.substitute(&through)))
            .collect();
        for row in std::mem::take(&mut self.rows) {
            let rewritten = self.normalize(&row_to_expr(&row));
            self.add_row(difference(&rewritten, &SymExpr::default()));
        }
    }

    /// Adds `row` to the echelon rows unless it reduces to nothing (or the
    /// reduction overflows, when the fact is dropped: dims it would have
    /// proved equal are then compared as written, never wrongly equated).
    fn add_row(&mut self, row: Row) {
        if let Some(reduced) = self.reduce(row) {
            if !reduced.is_empty() {
                self.rows.push(reduced);
            }
        }
    }

    /// `row` with every earlier pivot eliminated; `None` on overflow.
    fn reduce(&self, mut row: Row) -> Option<Row> {
        for basis in &self.rows {
            let (pivot, &p) = basis.iter().next()?;
            let Some(&c) = row.get(pivot) else { continue };
            let mut next = Row::new();
            for (m, &v) in &row {
                next.insert(m.clone(), v.checked_mul(p)?);
            }
            for (m, &v) in basis {
                let entry = next.entry(m.clone()).or_insert(0);
                *entry = entry.checked_sub(v.checked_mul(c)?)?;
            }
            next.retain(|_, v| *v != 0);
            row = divide_by_content(next);
        }
        Some(row)
    }
}

/// The symbol when `e` is exactly one symbol.
fn lone_symbol(e: &SymExpr) -> Option<Symbol> {
    let mut terms = e.terms();
    match (terms.next(), terms.next()) {
        (Some(([Atom::Sym(s)], 1)), None) => Some(*s),
        _ => None,
    }
}

/// `a - b` as a row.
fn difference(a: &SymExpr, b: &SymExpr) -> Row {
    let mut row = Row::new();
    for (m, c) in a.terms() {
        *row.entry(m.to_vec()).or_insert(0) += i128::from(c);
    }
    for (m, c) in b.terms() {
        *row.entry(m.to_vec()).or_insert(0) -= i128::from(c);
    }
    row.retain(|_, v| *v != 0);
    divide_by_content(row)
}

/// A row back as an expression (coefficients that do not fit an `i64`
/// saturate, as [`SymExpr`] arithmetic does).
fn row_to_expr(row: &Row) -> SymExpr {
    let mut e = SymExpr::default();
    for (m, &c) in row {
        let c = i64::try_from(c).unwrap_or(if c < 0 { i64::MIN } else { i64::MAX });
        let mut term = SymExpr::constant(c);
        for atom in m {
            let factor = match atom {
                Atom::Sym(s) => SymExpr::symbol(*s),
                Atom::FloorDiv(inner, d) => inner.floor_div(*d),
            };
            term = term.mul(&factor);
        }
        e = e.add(&term);
    }
    e
}

/// `row` divided by the gcd of its coefficients, its pivot made positive.
fn divide_by_content(mut row: Row) -> Row {
    let gcd = row.values().fold(0u128, |g, v| gcd(g, v.unsigned_abs()));
    let sign = match row.values().next() {
        Some(v) if *v < 0 => -1,
        _ => 1,
    };
    if gcd > 1 || sign < 0 {
        let gcd = i128::try_from(gcd).unwrap_or(1);
        for v in row.values_mut() {
            *v = sign * (*v / gcd);
        }
    }
    row
}

fn gcd(mut a: u128, mut b: u128) -> u128 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

thread_local! {
    /// The facts of the shapeless traces running on this thread, innermost
    /// last (a shapeless function called with concrete arguments inside
    /// another trace traces with symbols of its own).
    static TRACES: RefCell<Vec<DimFacts>> = const { RefCell::new(Vec::new()) };
}

/// The facts of one shapeless trace on this thread, from
/// [`TraceScope::open`] until the scope is dropped. Not `Send`: it belongs
/// to the thread whose trace it serves.
pub struct TraceScope {
    _thread_bound: std::marker::PhantomData<*const ()>,
}

impl TraceScope {
    /// Opens a scope with no facts; shape rules running on this thread
    /// record their equalities into it.
    pub fn open() -> TraceScope {
        TRACES.with(|t| t.borrow_mut().push(DimFacts::new()));
        TraceScope {
            _thread_bound: std::marker::PhantomData,
        }
    }

    /// The facts gathered so far.
    pub fn facts(&self) -> DimFacts {
        with_facts(DimFacts::clone)
    }
}

impl Drop for TraceScope {
    fn drop(&mut self) {
        TRACES.with(|t| t.borrow_mut().pop());
    }
}

/// Records `a == b`, assumed by `op`, in the innermost open trace scope
/// (nothing when none is open: outside a shapeless trace every dim is
/// known and no rule assumes anything).
pub fn assume_equal(op: &str, a: &Dim, b: &Dim) {
    TRACES.with(|t| {
        if let Some(facts) = t.borrow_mut().last_mut() {
            facts.assume_equal(op, a, b);
        }
    });
}

/// Runs `f` on the innermost trace's facts, or on no facts.
fn with_facts<R>(f: impl FnOnce(&DimFacts) -> R) -> R {
    TRACES.with(|t| match t.borrow().last() {
        Some(facts) => f(facts),
        None => f(&DimFacts::new()),
    })
}

/// True when `a == b` follows from the running trace's facts.
pub fn dims_equal(a: &Dim, b: &Dim) -> bool {
    a == b || with_facts(|facts| facts.dims_equal(a, b))
}

/// True when the shapes are equal under the running trace's facts.
pub fn shapes_equal(a: &Shape, b: &Shape) -> bool {
    a == b || with_facts(|facts| facts.shapes_equal(a, b))
}

/// True when the avals are equal under the running trace's facts.
pub fn avals_equal(a: &Aval, b: &Aval) -> bool {
    a == b || with_facts(|facts| facts.avals_equal(a, b))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(i: u32) -> SymExpr {
        SymExpr::symbol(Symbol(i))
    }

    fn dim(e: SymExpr) -> Dim {
        Dim::from_expr(e)
    }

    #[test]
    fn dims_are_equal_as_written_without_facts() {
        let facts = DimFacts::new();
        assert!(facts.dims_equal(&dim(s(0)), &dim(s(0))));
        assert!(!facts.dims_equal(&dim(s(0)), &dim(s(1))));
        assert!(!facts.dims_equal(&Dim::Known(2), &Dim::Known(3)));
    }

    #[test]
    fn equated_symbols_are_equal_inside_any_expression() {
        let mut facts = DimFacts::new();
        facts.assume_equal("mul", &dim(s(0)), &dim(s(1)));
        facts.assume_equal("add", &dim(s(2)), &dim(s(1)));
        assert!(facts.dims_equal(&dim(s(2)), &dim(s(0))));
        let product = |a: u32, b: u32| dim(s(a).mul(&s(b)).add(&SymExpr::constant(1)));
        assert!(facts.dims_equal(&product(0, 3), &product(2, 3)));
        assert!(!facts.dims_equal(&dim(s(3)), &dim(s(0))));
    }

    #[test]
    fn a_symbol_equated_to_a_constant_is_that_constant() {
        let mut facts = DimFacts::new();
        facts.assume_equal("matmul", &dim(s(1)), &Dim::Known(8));
        assert!(facts.dims_equal(&dim(s(1).scale(2)), &Dim::Known(16)));
        assert!(!facts.dims_equal(&dim(s(1)), &Dim::Known(9)));
    }

    #[test]
    fn a_divisibility_guard_makes_the_rounded_size_the_size() {
        let rounded = dim(s(0).floor_div(32).scale(32));
        let mut facts = DimFacts::new();
        assert!(!facts.dims_equal(&rounded, &dim(s(0))));
        facts.assume_equal("quantize", &dim(s(0)), &rounded);
        assert!(facts.dims_equal(&rounded, &dim(s(0))));
        // And linear consequences of it, with other facts.
        facts.assume_equal("add", &dim(s(1)), &dim(s(0)));
        assert!(facts.dims_equal(&dim(s(1).floor_div(32).scale(64)), &dim(s(0).scale(2))));
    }

    #[test]
    fn linear_facts_combine() {
        // s0 = s1 + s2 and s2 = 2·s3 give s0 = s1 + 2·s3, not s0 = s1.
        let mut facts = DimFacts::new();
        facts.assume_equal("concat", &dim(s(0)), &dim(s(1).add(&s(2))));
        facts.assume_equal("reshape", &dim(s(2)), &dim(s(3).scale(2)));
        assert!(facts.dims_equal(&dim(s(0)), &dim(s(1).add(&s(3).scale(2)))));
        assert!(!facts.dims_equal(&dim(s(0)), &dim(s(1))));
    }

    #[test]
    fn an_equality_already_implied_is_not_recorded_again() {
        let mut facts = DimFacts::new();
        facts.assume_equal("mul", &dim(s(0)), &dim(s(1)));
        facts.assume_equal("add", &dim(s(1)), &dim(s(0)));
        assert_eq!(facts.assumed().len(), 1);
    }

    #[test]
    fn the_trace_scope_holds_the_running_trace_facts_and_nests() {
        assert!(!dims_equal(&dim(s(0)), &dim(s(1))));
        let outer = TraceScope::open();
        assume_equal("mul", &dim(s(0)), &dim(s(1)));
        assert!(dims_equal(&dim(s(0)), &dim(s(1))));
        {
            let _inner = TraceScope::open();
            assert!(
                !dims_equal(&dim(s(0)), &dim(s(1))),
                "a nested trace has symbols of its own"
            );
        }
        assert!(dims_equal(&dim(s(0)), &dim(s(1))));
        assert_eq!(outer.facts().assumed().len(), 1);
        drop(outer);
        assert!(!dims_equal(&dim(s(0)), &dim(s(1))));
    }
}
