//! Symbolic dimensions: a dim is a sum of monomials (integer coefficient times a product of
//! named symbols), each symbol carrying the interval of values it may take (its gears).
//!
//! This is enough for what shape inference meets in practice: `N`, `N*3*224`, `N*S`, `S+1`,
//! exact division of one monomial by another (Reshape with -1), and equality. Intervals are
//! evaluated from the symbols' bounds (all symbols are non-negative, coefficients of products
//! come out positive for real shapes) so a conflict can say "N in [1, 8]".

use std::collections::BTreeMap;
use std::fmt;

/// A named symbol and the values it may take.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Symbol {
    /// Name, e.g. `data.0` for dim 0 of input `data`.
    pub name: String,
    /// Smallest value.
    pub lo: i64,
    /// Largest value.
    pub hi: i64,
}

/// Monomials: (coefficient, sorted symbol names with repetition for powers).
type Terms = Vec<(i64, Vec<String>)>;
/// Each symbol's (smallest, largest) value.
type Bounds = BTreeMap<String, (i64, i64)>;

/// A symbolic dim in canonical form: monomials sorted by their symbol lists, no zero
/// coefficients, at least one symbol somewhere (a pure constant is a `Dim::Fixed`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SymExpr {
    /// (coefficient, sorted symbol names with repetition for powers).
    terms: Vec<(i64, Vec<String>)>,
    /// Bounds of every symbol appearing in the terms.
    bounds: BTreeMap<String, (i64, i64)>,
}

/// A dimension: a known size or a symbolic one.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Dim {
    /// A known size.
    Fixed(i64),
    /// A size known only as an expression of symbols.
    Sym(SymExpr),
}

impl Dim {
    /// A new symbol.
    pub fn symbol(s: &Symbol) -> Dim {
        let mut bounds = BTreeMap::new();
        bounds.insert(s.name.clone(), (s.lo, s.hi));
        Dim::Sym(SymExpr {
            terms: vec![(1, vec![s.name.clone()])],
            bounds,
        })
    }

    /// The value when known.
    pub fn fixed(&self) -> Option<i64> {
        match self {
            Dim::Fixed(v) => Some(*v),
            Dim::Sym(_) => None,
        }
    }

    /// Smallest and largest value it may take.
    pub fn interval(&self) -> (i64, i64) {
        match self {
            Dim::Fixed(v) => (*v, *v),
            Dim::Sym(e) => e.interval(),
        }
    }

    fn terms(&self) -> (Terms, Bounds) {
        match self {
            Dim::Fixed(0) => (vec![], BTreeMap::new()),
            Dim::Fixed(v) => (vec![(*v, vec![])], BTreeMap::new()),
            Dim::Sym(e) => (e.terms.clone(), e.bounds.clone()),
        }
    }

    fn from_terms(terms: Vec<(i64, Vec<String>)>, bounds: BTreeMap<String, (i64, i64)>) -> Dim {
        let mut merged: BTreeMap<Vec<String>, i64> = BTreeMap::new();
        for (c, mut syms) in terms {
            syms.sort();
            *merged.entry(syms).or_insert(0) += c;
        }
        let terms: Vec<(i64, Vec<String>)> = merged
            .into_iter()
            .filter(|(_, c)| *c != 0)
            .map(|(s, c)| (c, s))
            .collect();
        if terms.iter().all(|(_, s)| s.is_empty()) {
            return Dim::Fixed(terms.iter().map(|(c, _)| *c).sum());
        }
        let used: BTreeMap<String, (i64, i64)> = bounds
            .into_iter()
            .filter(|(k, _)| terms.iter().any(|(_, s)| s.contains(k)))
            .collect();
        Dim::Sym(SymExpr {
            terms,
            bounds: used,
        })
    }

    /// `self + other`.
    pub fn add(&self, other: &Dim) -> Dim {
        let (mut a, mut ba) = self.terms();
        let (b, bb) = other.terms();
        a.extend(b);
        ba.extend(bb);
        Dim::from_terms(a, ba)
    }

    /// `self - other`.
    pub fn sub(&self, other: &Dim) -> Dim {
        self.add(&other.mul(&Dim::Fixed(-1)))
    }

    /// `self * other`.
    pub fn mul(&self, other: &Dim) -> Dim {
        let (a, mut ba) = self.terms();
        let (b, bb) = other.terms();
        ba.extend(bb);
        let mut out = Vec::new();
        for (ca, sa) in &a {
            for (cb, sb) in &b {
                let mut s = sa.clone();
                s.extend(sb.iter().cloned());
                out.push((ca * cb, s));
            }
        }
        Dim::from_terms(out, ba)
    }

    /// `self / other` when the division is exact (for Reshape's -1), else `None`.
    pub fn div_exact(&self, other: &Dim) -> Option<Dim> {
        match (self, other) {
            (_, Dim::Fixed(0)) => None,
            (Dim::Fixed(a), Dim::Fixed(b)) => (a % b == 0).then(|| Dim::Fixed(a / b)),
            _ => {
                let (b, _) = other.terms();
                // Only division by a single monomial is supported.
                let [(cb, sb)] = b.as_slice() else {
                    return None;
                };
                let (a, ba) = self.terms();
                let mut out = Vec::new();
                for (ca, sa) in a {
                    if ca % cb != 0 {
                        return None;
                    }
                    let mut rest = sa.clone();
                    for s in sb {
                        let i = rest.iter().position(|x| x == s)?;
                        rest.remove(i);
                    }
                    out.push((ca / cb, rest));
                }
                Some(Dim::from_terms(out, ba))
            }
        }
    }

    /// The value with every symbol replaced by a number (`None` if a symbol is missing).
    pub fn eval(&self, values: &BTreeMap<String, i64>) -> Option<i64> {
        match self {
            Dim::Fixed(v) => Some(*v),
            Dim::Sym(e) => {
                let mut total = 0i64;
                for (c, syms) in &e.terms {
                    let mut t = *c;
                    for s in syms {
                        t = t.checked_mul(*values.get(s)?)?;
                    }
                    total = total.checked_add(t)?;
                }
                Some(total)
            }
        }
    }
}

impl SymExpr {
    fn interval(&self) -> (i64, i64) {
        let lo: BTreeMap<String, i64> = self.bounds.iter().map(|(k, v)| (k.clone(), v.0)).collect();
        let hi: BTreeMap<String, i64> = self.bounds.iter().map(|(k, v)| (k.clone(), v.1)).collect();
        let a = Dim::Sym(self.clone()).eval(&lo).unwrap_or(i64::MIN);
        let b = Dim::Sym(self.clone()).eval(&hi).unwrap_or(i64::MAX);
        (a.min(b), a.max(b))
    }
}

impl fmt::Display for Dim {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Dim::Fixed(v) => write!(f, "{v}"),
            Dim::Sym(e) => {
                // Symbol terms first, the constant last: `N+1`, not `1+N`.
                let ordered = e
                    .terms
                    .iter()
                    .filter(|(_, s)| !s.is_empty())
                    .chain(e.terms.iter().filter(|(_, s)| s.is_empty()));
                for (i, (c, syms)) in ordered.enumerate() {
                    if i > 0 {
                        f.write_str(if *c < 0 { "-" } else { "+" })?;
                    } else if *c < 0 {
                        f.write_str("-")?;
                    }
                    let c = c.abs();
                    let mut parts: Vec<String> = Vec::new();
                    if c != 1 || syms.is_empty() {
                        parts.push(c.to_string());
                    }
                    parts.extend(syms.iter().cloned());
                    f.write_str(&parts.join("*"))?;
                }
                let (lo, hi) = e.interval();
                write!(f, "[{lo}..{hi}]")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn n() -> Dim {
        Dim::symbol(&Symbol {
            name: "N".into(),
            lo: 1,
            hi: 8,
        })
    }

    #[test]
    fn arithmetic_is_canonical() {
        let a = n().mul(&Dim::Fixed(3)).mul(&Dim::Fixed(224));
        let b = Dim::Fixed(672).mul(&n());
        assert_eq!(a, b);
        assert_eq!(a.div_exact(&n()), Some(Dim::Fixed(672)));
        assert_eq!(a.div_exact(&Dim::Fixed(224)), Some(n().mul(&Dim::Fixed(3))));
        assert_eq!(n().sub(&n()), Dim::Fixed(0));
        assert_eq!(a.interval(), (672, 5376));
        assert_eq!(n().add(&Dim::Fixed(1)).to_string(), "N+1[2..9]");
        assert_eq!(a.to_string(), "672*N[672..5376]");
        let mut v = BTreeMap::new();
        v.insert("N".to_string(), 4);
        assert_eq!(a.eval(&v), Some(2688));
        assert_eq!(Dim::Fixed(7).div_exact(&Dim::Fixed(2)), None);
    }
}
