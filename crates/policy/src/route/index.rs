//! The route index: built once at config load, it hands a request head the few routes whose
//! host and path can match it, so routing costs the same with one route or 100,000
//! (design.md §2 rule 7).
//!
//! Hosts: exact hosts in a hash; wildcard suffixes (`*.example.com`) in a trie over the
//! host's bytes read from the end, so one walk of the request's host finds every suffix it
//! ends with; routes for any host on their own. Under each host, paths: exact paths in a
//! hash, prefixes in a tree by `/`-segment, so one walk of the request's path finds every
//! prefix it starts with on a segment boundary.
//!
//! The index only narrows: each place holds route numbers in precedence order, and the
//! router tests the full match (method, headers) on them, taking the lowest number that
//! matches, which is exactly the route a scan of the whole table in precedence order would
//! take. Written by hand because the match is the Gateway API's (segment-bounded
//! prefixes, case-insensitive hosts, arbitrary wildcard suffixes) and no router crate does
//! that; `matchit`-style tries answer one pattern, not every candidate in order.
//!
//! Hashes are std's keyed SipHash: the keys come from clients, so a table that a crafted
//! host or path could flood into one bucket would make routing slow on demand.

use std::borrow::Cow;
use std::collections::HashMap;

use tailguard_config::PathMatch;

/// Host part of a route's match.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostMatch {
    /// Any host.
    Any,
    /// This host exactly (lowercase, no port).
    Exact(String),
    /// Any subdomain of this suffix; holds `.example.com` for `*.example.com`.
    Suffix(String),
}

/// Route numbers in precedence order (ascending). Most places hold one route.
type Ids = Box<[u32]>;

/// The paths of the routes of one host (or one wildcard, or any host).
#[derive(Debug, Default)]
struct Paths {
    /// Exact paths.
    exact: HashMap<Box<str>, Ids>,
    /// Prefixes, by segment: node 0 stands before the first segment.
    prefixes: Vec<Segment>,
}

/// One node of the prefix tree: the routes whose prefix ends here and the next segments.
#[derive(Debug, Default)]
struct Segment {
    routes: Ids,
    next: HashMap<Box<str>, u32>,
}

/// One node of the wildcard trie: `paths` holds the routes whose suffix is the bytes read
/// from the end of the host to reach this node; `next` is sorted by byte.
#[derive(Debug, Default)]
struct Suffix {
    paths: Option<Box<Paths>>,
    next: Box<[(u8, u32)]>,
}

/// Which routes can match a host and a path.
#[derive(Debug, Default)]
pub(crate) struct RouteIndex {
    hosts: HashMap<Box<str>, Paths>,
    /// Node 0 is the empty suffix.
    wildcards: Vec<Suffix>,
    any: Paths,
}

/// Hosts longer than this are lowercased on the heap; no DNS name is (253 bytes at most).
const HOST_ON_STACK: usize = 256;

impl RouteIndex {
    /// The index of routes given in precedence order: route `i` is number `i`.
    pub(crate) fn build<'a>(routes: impl Iterator<Item = (&'a HostMatch, &'a PathMatch)>) -> Self {
        let mut hosts: HashMap<Box<str>, PathsBuilder> = HashMap::new();
        let mut wildcards = SuffixBuilder::default();
        let mut any = PathsBuilder::default();
        for (i, (host, path)) in routes.enumerate() {
            let id = u32::try_from(i).expect("a config holds far fewer than 4 billion routes");
            let paths = match host {
                HostMatch::Any => &mut any,
                HostMatch::Exact(h) => hosts.entry(Box::from(h.as_str())).or_default(),
                HostMatch::Suffix(s) => wildcards.paths(s),
            };
            paths.add(id, path);
        }
        RouteIndex {
            hosts: hosts.into_iter().map(|(h, p)| (h, p.finish())).collect(),
            wildcards: wildcards.finish(),
            any: any.finish(),
        }
    }

    /// Calls `each` with the routes that can match `host` and `path`, list by list, each
    /// list in ascending order, and returns the lowest number for which `each` said yes.
    /// A list is left as soon as `each` says yes or its numbers pass the best so far.
    pub(crate) fn find(&self, host: &str, path: &str, each: impl Fn(u32) -> bool) -> Option<u32> {
        let mut best = None;
        let mut try_list = |ids: &[u32]| {
            for &id in ids {
                if best.is_some_and(|b| id >= b) {
                    return;
                }
                if each(id) {
                    best = Some(id);
                    return;
                }
            }
        };
        if !self.hosts.is_empty()
            && let Some(paths) = self.hosts.get(&*lowercase(host, &mut [0; HOST_ON_STACK]))
        {
            paths.find(path, &mut try_list);
        }
        if !self.wildcards.is_empty() {
            // Read the host from its end. A node's suffix applies only to a longer host (a
            // wildcard does not match the apex), so the node that spells the whole host is
            // never asked.
            let mut node = &self.wildcards[0];
            for &b in host.as_bytes().iter().rev() {
                if let Some(paths) = &node.paths {
                    paths.find(path, &mut try_list);
                }
                let b = b.to_ascii_lowercase();
                match node.next.binary_search_by_key(&b, |&(byte, _)| byte) {
                    Ok(at) => node = &self.wildcards[node.next[at].1 as usize],
                    Err(_) => break,
                }
            }
        }
        self.any.find(path, &mut try_list);
        best
    }
}

impl Paths {
    fn find(&self, path: &str, try_list: &mut impl FnMut(&[u32])) {
        if !self.exact.is_empty()
            && let Some(ids) = self.exact.get(path)
        {
            try_list(ids);
        }
        if self.prefixes.is_empty() {
            return;
        }
        // A prefix matches on a segment boundary: its segments begin the path's.
        let mut node = &self.prefixes[0];
        for segment in path.split('/') {
            match node.next.get(segment) {
                Some(&next) => {
                    node = &self.prefixes[next as usize];
                    try_list(&node.routes);
                }
                None => return,
            }
        }
    }
}

/// `host` in ASCII lowercase (as route hosts are kept), borrowed when it already is, in
/// `buf` when it fits.
fn lowercase<'a>(host: &'a str, buf: &'a mut [u8; HOST_ON_STACK]) -> Cow<'a, str> {
    if !host.bytes().any(|b| b.is_ascii_uppercase()) {
        return Cow::Borrowed(host);
    }
    let Some(out) = buf.get_mut(..host.len()) else {
        return Cow::Owned(host.to_ascii_lowercase());
    };
    out.copy_from_slice(host.as_bytes());
    out.make_ascii_lowercase();
    Cow::Borrowed(std::str::from_utf8(out).expect("ASCII case folding keeps UTF-8 valid"))
}

/// A prefix tree's node while routes are added: its routes, its next segments.
type SegmentBuilder = (Vec<u32>, HashMap<Box<str>, u32>);

/// A wildcard trie's node while routes are added: its paths, its next bytes.
type SuffixNodeBuilder = (Option<PathsBuilder>, Vec<(u8, u32)>);

/// [`Paths`] while routes are added.
#[derive(Debug, Default)]
struct PathsBuilder {
    exact: HashMap<Box<str>, Vec<u32>>,
    prefixes: Vec<SegmentBuilder>,
}

impl PathsBuilder {
    fn add(&mut self, id: u32, path: &PathMatch) {
        match path {
            PathMatch::Exact(p) => self
                .exact
                .entry(Box::from(p.as_str()))
                .or_default()
                .push(id),
            PathMatch::Prefix(p) => {
                // As the scan reads it: `/api/` is `/api`, `/` is every path.
                let p = p.trim_end_matches('/');
                if self.prefixes.is_empty() {
                    self.prefixes.push(Default::default());
                }
                let mut node = 0usize;
                for segment in p.split('/') {
                    let fresh = u32::try_from(self.prefixes.len())
                        .expect("a config holds far fewer than 4 billion segments");
                    let next = *self.prefixes[node]
                        .1
                        .entry(Box::from(segment))
                        .or_insert(fresh);
                    if next == fresh {
                        self.prefixes.push(Default::default());
                    }
                    node = next as usize;
                }
                self.prefixes[node].0.push(id);
            }
        }
    }

    fn finish(self) -> Paths {
        Paths {
            exact: self
                .exact
                .into_iter()
                .map(|(p, ids)| (p, ids.into_boxed_slice()))
                .collect(),
            prefixes: self
                .prefixes
                .into_iter()
                .map(|(ids, mut next)| {
                    next.shrink_to_fit();
                    Segment {
                        routes: ids.into_boxed_slice(),
                        next,
                    }
                })
                .collect(),
        }
    }
}

/// The wildcard trie while routes are added.
#[derive(Debug, Default)]
struct SuffixBuilder {
    nodes: Vec<SuffixNodeBuilder>,
}

impl SuffixBuilder {
    /// The paths of wildcard suffix `suffix` (made if new).
    fn paths(&mut self, suffix: &str) -> &mut PathsBuilder {
        if self.nodes.is_empty() {
            self.nodes.push(Default::default());
        }
        let mut node = 0usize;
        for &b in suffix.as_bytes().iter().rev() {
            let b = b.to_ascii_lowercase();
            let fresh =
                u32::try_from(self.nodes.len()).expect("far fewer than 4 billion suffix bytes");
            let next = &mut self.nodes[node].1;
            node = match next.binary_search_by_key(&b, |&(byte, _)| byte) {
                Ok(at) => next[at].1 as usize,
                Err(at) => {
                    next.insert(at, (b, fresh));
                    self.nodes.push(Default::default());
                    fresh as usize
                }
            };
        }
        self.nodes[node].0.get_or_insert_default()
    }

    fn finish(self) -> Vec<Suffix> {
        self.nodes
            .into_iter()
            .map(|(paths, next)| Suffix {
                paths: paths.map(|p| Box::new(p.finish())),
                next: next.into_boxed_slice(),
            })
            .collect()
    }
}
