//! `allow` / `deny` of a route or a listener: who may call it by address, as written, and
//! its check.
//!
//! The rule (docs/config.md, "By address"): **deny wins**, whatever the order the lists are
//! written in. An address in a `deny` network is refused; else, with an `allow` list, only
//! an address in one of its networks passes; with only `deny`, every other address passes.
//! nginx reads its `allow`/`deny` lines in order and the first match decides; that order is
//! easy to get wrong when lines are added later (an early broad `allow` silently disables a
//! later `deny`), and a set rule can be looked up in a structure built at load instead of a
//! scan in order. What nginx writes as `allow 10.1.2.3; deny 10.0.0.0/8;` ("of 10/8 only
//! this one") is written here as `allow = ["10.1.2.3"]`.

use std::ops::Range;

use toml::Spanned;

use crate::cidr::Cidr;

/// A route's or a listener's address lists, borrowed from its config: each network as
/// written, parsed by [`AccessConfig::check`] (every bad one reported at its element, the
/// rest of the route still checked) and again when the runtime builds its lists.
#[derive(Debug, Clone, Copy)]
pub struct AccessConfig<'a> {
    /// `allow`: when given, only these networks pass.
    pub allow: Option<&'a Spanned<Vec<Spanned<String>>>>,
    /// `deny`: these networks never pass.
    pub deny: Option<&'a Spanned<Vec<Spanned<String>>>>,
}

/// The networks of a list that parse (after [`AccessConfig::check`], all of them).
pub fn networks(list: &Spanned<Vec<Spanned<String>>>) -> Vec<Cidr> {
    list.get_ref()
        .iter()
        .filter_map(|n| n.get_ref().parse().ok())
        .collect()
}

impl AccessConfig<'_> {
    /// Whether either list is written (an empty `deny` counts as none).
    pub fn is_set(&self) -> bool {
        self.allow.is_some() || self.deny.is_some_and(|d| !d.get_ref().is_empty())
    }

    /// Problems with the lists, as (span, field, message); the field is `allow[i]`,
    /// `deny[i]` or `allow`.
    pub fn check(&self) -> Vec<(Option<Range<usize>>, String, String)> {
        let mut out = Vec::new();
        for (name, list) in [("allow", self.allow), ("deny", self.deny)] {
            for (i, network) in list.into_iter().flat_map(|l| l.get_ref()).enumerate() {
                if let Err(message) = network.get_ref().parse::<Cidr>() {
                    out.push((Some(network.span()), format!("{name}[{i}]"), message));
                }
            }
        }
        if let Some(allow) = self.allow
            && allow.get_ref().is_empty()
        {
            out.push((
                Some(allow.span()),
                "allow".to_owned(),
                "an empty `allow` would refuse every address; leave it out to allow every \
                 address"
                    .to_owned(),
            ));
        }
        out
    }
}
