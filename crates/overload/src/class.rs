//! A request's priority class and the rejection a full limiter answers with: the words the
//! shedder and the upstream limits share.

/// Priority class of a request or route. Higher classes keep being admitted longer.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    Default,
    serde::Serialize,
    serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum Class {
    /// Shed first: admitted while in-flight <= 0.5·L.
    Low,
    /// The default: admitted while in-flight <= L.
    #[default]
    Normal,
    /// Admitted while in-flight <= 1.5·L.
    High,
    /// Never shed (still counted in flight, so it shares the capacity it uses).
    Critical,
}

impl Class {
    /// All classes, in index order.
    pub const ALL: [Class; 4] = [Class::Low, Class::Normal, Class::High, Class::Critical];

    /// Dense index for per-class arrays.
    pub fn index(self) -> usize {
        self as usize
    }

    /// Lower-case name (metrics label, config value).
    pub fn as_str(self) -> &'static str {
        match self {
            Class::Low => "low",
            Class::Normal => "normal",
            Class::High => "high",
            Class::Critical => "critical",
        }
    }

    /// Parses a lower-case name.
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|c| c.as_str() == s)
    }
}

/// A rejection: the caller answers 503 with `Retry-After` and reads no body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rejected {
    /// Class of the rejected request.
    pub class: Class,
    /// In-flight above twice the limit: close the connection (HTTP/1.1 `Connection: close`).
    pub severe: bool,
}

impl std::fmt::Display for Rejected {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "service overloaded ({} request shed)",
            self.class.as_str()
        )
    }
}

impl std::error::Error for Rejected {}
