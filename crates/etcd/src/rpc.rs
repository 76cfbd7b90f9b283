//! The etcd v3 messages tailguard sends and reads, written by hand with `prost`'s derive: the
//! subset of `api/etcdserverpb/rpc.proto` and `api/mvccpb/kv.proto` (etcd 3.4 and later)
//! that the KV `Range`, `Put`, `DeleteRange`, `Txn`, `Compact` calls, the `Watch` stream and
//! the `Auth` calls (`Authenticate`, and `UserAdd`, `UserGrantRole`, `UserChangePassword`,
//! `AuthEnable` to set authentication up) need, with etcd's field numbers and types.
//!
//! Fields left out are skipped on decode (protobuf ignores unknown fields) and never sent
//! (proto3 reads a missing field as its default, which is what tailguard would send).

/// `etcdserverpb.ResponseHeader`: the store's revision when a request was served.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ResponseHeader {
    /// The key-value store's revision when the request was applied (the newest revision
    /// the answer reflects).
    #[prost(int64, tag = "3")]
    pub revision: i64,
}

/// `mvccpb.KeyValue`: a key, its value and its history.
#[derive(Clone, PartialEq, prost::Message)]
pub struct KeyValue {
    /// The key.
    #[prost(bytes = "vec", tag = "1")]
    pub key: Vec<u8>,
    /// The revision of the key's last creation.
    #[prost(int64, tag = "2")]
    pub create_revision: i64,
    /// The revision of the key's last modification.
    #[prost(int64, tag = "3")]
    pub mod_revision: i64,
    /// How many times the key was written since its creation (1 after the creation).
    #[prost(int64, tag = "4")]
    pub version: i64,
    /// The value.
    #[prost(bytes = "vec", tag = "5")]
    pub value: Vec<u8>,
}

/// `etcdserverpb.RangeRequest` (`KV/Range`): one key, or the keys in `[key, range_end)`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RangeRequest {
    /// The key (or the range's first key).
    #[prost(bytes = "vec", tag = "1")]
    pub key: Vec<u8>,
    /// Empty: `key` alone.
    #[prost(bytes = "vec", tag = "2")]
    pub range_end: Vec<u8>,
}

/// `etcdserverpb.RangeResponse`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RangeResponse {
    /// The store's revision at the read.
    #[prost(message, optional, tag = "1")]
    pub header: Option<ResponseHeader>,
    /// The keys found (none if the key does not exist).
    #[prost(message, repeated, tag = "2")]
    pub kvs: Vec<KeyValue>,
}

/// `etcdserverpb.PutRequest` (`KV/Put`).
#[derive(Clone, PartialEq, prost::Message)]
pub struct PutRequest {
    /// The key.
    #[prost(bytes = "vec", tag = "1")]
    pub key: Vec<u8>,
    /// The value.
    #[prost(bytes = "vec", tag = "2")]
    pub value: Vec<u8>,
}

/// `etcdserverpb.PutResponse`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct PutResponse {
    /// The revision the put created.
    #[prost(message, optional, tag = "1")]
    pub header: Option<ResponseHeader>,
}

/// `etcdserverpb.DeleteRangeRequest` (`KV/DeleteRange`).
#[derive(Clone, PartialEq, prost::Message)]
pub struct DeleteRangeRequest {
    /// The key (or the range's first key).
    #[prost(bytes = "vec", tag = "1")]
    pub key: Vec<u8>,
    /// Empty: `key` alone.
    #[prost(bytes = "vec", tag = "2")]
    pub range_end: Vec<u8>,
}

/// `etcdserverpb.DeleteRangeResponse`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct DeleteRangeResponse {
    /// The revision the delete created (the store's, if nothing was deleted).
    #[prost(message, optional, tag = "1")]
    pub header: Option<ResponseHeader>,
    /// How many keys were deleted.
    #[prost(int64, tag = "2")]
    pub deleted: i64,
}

/// `etcdserverpb.Compare`: one condition of a transaction, on a key's revisions.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Compare {
    /// How the key's value of `target` compares to the one given.
    #[prost(enumeration = "compare::CompareResult", tag = "1")]
    pub result: i32,
    /// Which of the key's revisions is compared.
    #[prost(enumeration = "compare::CompareTarget", tag = "2")]
    pub target: i32,
    /// The key.
    #[prost(bytes = "vec", tag = "3")]
    pub key: Vec<u8>,
    /// The value compared with, of the `target`'s kind.
    #[prost(oneof = "compare::TargetUnion", tags = "5, 6")]
    pub target_union: Option<compare::TargetUnion>,
}

/// `Compare`'s enums and its oneof.
pub mod compare {
    /// `Compare.CompareResult` (only `EQUAL` is used).
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
    #[repr(i32)]
    pub enum CompareResult {
        /// The key's revision equals the one given.
        Equal = 0,
    }

    /// `Compare.CompareTarget` (the two revisions tailguard compares, and proto3's default).
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
    #[repr(i32)]
    pub enum CompareTarget {
        /// The key's version (unused). Listed because prost takes an enum's first variant as
        /// the field's default and leaves a field at its default off the wire: without it,
        /// `Create` would never be sent and etcd would read the default, `VERSION`.
        Version = 0,
        /// The key's create revision.
        Create = 1,
        /// The key's mod revision.
        Mod = 2,
    }

    /// `Compare.target_union`. Set, it is always sent, 0 included: a key that does not
    /// exist has revisions 0.
    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum TargetUnion {
        /// With [`CompareTarget::Create`].
        #[prost(int64, tag = "5")]
        CreateRevision(i64),
        /// With [`CompareTarget::Mod`].
        #[prost(int64, tag = "6")]
        ModRevision(i64),
    }
}

impl Compare {
    /// The key's mod revision is `revision` (0: the key does not exist).
    pub fn mod_revision(key: impl Into<Vec<u8>>, revision: i64) -> Compare {
        Compare {
            result: compare::CompareResult::Equal as i32,
            target: compare::CompareTarget::Mod as i32,
            key: key.into(),
            target_union: Some(compare::TargetUnion::ModRevision(revision)),
        }
    }

    /// The key's create revision is `revision` (0: the key does not exist).
    pub fn create_revision(key: impl Into<Vec<u8>>, revision: i64) -> Compare {
        Compare {
            result: compare::CompareResult::Equal as i32,
            target: compare::CompareTarget::Create as i32,
            key: key.into(),
            target_union: Some(compare::TargetUnion::CreateRevision(revision)),
        }
    }
}

/// `etcdserverpb.RequestOp`: one operation of a transaction.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RequestOp {
    /// The operation.
    #[prost(oneof = "request_op::Request", tags = "1, 2")]
    pub request: Option<request_op::Request>,
}

/// `RequestOp`'s oneof.
pub mod request_op {
    /// `RequestOp.request`: a read or a write.
    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum Request {
        /// A read.
        #[prost(message, tag = "1")]
        RequestRange(super::RangeRequest),
        /// A write.
        #[prost(message, tag = "2")]
        RequestPut(super::PutRequest),
    }
}

impl RequestOp {
    /// Read `key`.
    pub fn range(key: impl Into<Vec<u8>>) -> RequestOp {
        RequestOp {
            request: Some(request_op::Request::RequestRange(RangeRequest {
                key: key.into(),
                range_end: Vec::new(),
            })),
        }
    }

    /// Write `value` under `key`.
    pub fn put(key: impl Into<Vec<u8>>, value: impl Into<Vec<u8>>) -> RequestOp {
        RequestOp {
            request: Some(request_op::Request::RequestPut(PutRequest {
                key: key.into(),
                value: value.into(),
            })),
        }
    }
}

/// `etcdserverpb.ResponseOp`: the answer to one [`RequestOp`].
#[derive(Clone, PartialEq, prost::Message)]
pub struct ResponseOp {
    /// The answer.
    #[prost(oneof = "response_op::Response", tags = "1, 2")]
    pub response: Option<response_op::Response>,
}

/// `ResponseOp`'s oneof.
pub mod response_op {
    /// `ResponseOp.response`.
    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum Response {
        /// The answer to a read.
        #[prost(message, tag = "1")]
        ResponseRange(super::RangeResponse),
        /// The answer to a write.
        #[prost(message, tag = "2")]
        ResponsePut(super::PutResponse),
    }
}

/// `etcdserverpb.TxnRequest` (`KV/Txn`): if every compare holds, `success`, else `failure`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct TxnRequest {
    /// The conditions.
    #[prost(message, repeated, tag = "1")]
    pub compare: Vec<Compare>,
    /// What to do if they all hold.
    #[prost(message, repeated, tag = "2")]
    pub success: Vec<RequestOp>,
    /// What to do otherwise.
    #[prost(message, repeated, tag = "3")]
    pub failure: Vec<RequestOp>,
}

/// `etcdserverpb.TxnResponse`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct TxnResponse {
    /// The revision after the transaction.
    #[prost(message, optional, tag = "1")]
    pub header: Option<ResponseHeader>,
    /// Whether every compare held (so `success` ran).
    #[prost(bool, tag = "2")]
    pub succeeded: bool,
    /// The answers of the operations that ran, in order.
    #[prost(message, repeated, tag = "3")]
    pub responses: Vec<ResponseOp>,
}

/// `etcdserverpb.CompactionRequest` (`KV/Compact`): forget the history before `revision`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct CompactionRequest {
    /// Revisions before this one are compacted away.
    #[prost(int64, tag = "1")]
    pub revision: i64,
    /// Answer only once the compaction is applied to the backend.
    #[prost(bool, tag = "2")]
    pub physical: bool,
}

/// `etcdserverpb.CompactionResponse`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct CompactionResponse {
    /// The store's revision.
    #[prost(message, optional, tag = "1")]
    pub header: Option<ResponseHeader>,
}

/// `etcdserverpb.WatchRequest`: what a client sends on the `Watch` stream.
#[derive(Clone, PartialEq, prost::Message)]
pub struct WatchRequest {
    /// The request (only creation is used).
    #[prost(oneof = "watch_request::RequestUnion", tags = "1")]
    pub request_union: Option<watch_request::RequestUnion>,
}

/// `WatchRequest`'s oneof.
pub mod watch_request {
    /// `WatchRequest.request_union`.
    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum RequestUnion {
        /// Start a watch.
        #[prost(message, tag = "1")]
        CreateRequest(super::WatchCreateRequest),
    }
}

/// `etcdserverpb.WatchCreateRequest`: watch a key (or a range) from a revision on.
#[derive(Clone, PartialEq, prost::Message)]
pub struct WatchCreateRequest {
    /// The key (or the range's first key).
    #[prost(bytes = "vec", tag = "1")]
    pub key: Vec<u8>,
    /// Empty: `key` alone.
    #[prost(bytes = "vec", tag = "2")]
    pub range_end: Vec<u8>,
    /// The first revision to send events of; 0: from the next change on. If it has been
    /// compacted away, etcd cancels the watch with `compact_revision` set.
    #[prost(int64, tag = "3")]
    pub start_revision: i64,
    /// Ask for empty responses every few minutes carrying the store's revision.
    #[prost(bool, tag = "4")]
    pub progress_notify: bool,
}

/// `etcdserverpb.WatchResponse`: a watch created or cancelled, or events.
#[derive(Clone, PartialEq, prost::Message)]
pub struct WatchResponse {
    /// The store's revision when the response was sent.
    #[prost(message, optional, tag = "1")]
    pub header: Option<ResponseHeader>,
    /// Which watch of the stream this is about.
    #[prost(int64, tag = "2")]
    pub watch_id: i64,
    /// The answer to a create request: the watch is established.
    #[prost(bool, tag = "3")]
    pub created: bool,
    /// The watch is cancelled: no events follow.
    #[prost(bool, tag = "4")]
    pub canceled: bool,
    /// Set (with `canceled`) when the start revision is compacted away: the oldest
    /// revision still kept.
    #[prost(int64, tag = "5")]
    pub compact_revision: i64,
    /// Why the watch was cancelled.
    #[prost(string, tag = "6")]
    pub cancel_reason: String,
    /// The changes, oldest first.
    #[prost(message, repeated, tag = "11")]
    pub events: Vec<Event>,
}

/// `mvccpb.Event`: one change of a watched key.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Event {
    /// Put or delete.
    #[prost(enumeration = "event::EventType", tag = "1")]
    pub r#type: i32,
    /// The key after the change (a delete: the key and the deletion's revision).
    #[prost(message, optional, tag = "2")]
    pub kv: Option<KeyValue>,
    /// The key before the change, if the watch asked for it.
    #[prost(message, optional, tag = "3")]
    pub prev_kv: Option<KeyValue>,
}

/// `Event`'s enum.
pub mod event {
    /// `Event.EventType`.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
    #[repr(i32)]
    pub enum EventType {
        /// The key was written.
        Put = 0,
        /// The key was deleted.
        Delete = 1,
    }
}

/// `etcdserverpb.AuthenticateRequest` (`Auth/Authenticate`): a user's name and password.
#[derive(Clone, PartialEq, prost::Message)]
pub struct AuthenticateRequest {
    /// The user name.
    #[prost(string, tag = "1")]
    pub name: String,
    /// The password.
    #[prost(string, tag = "2")]
    pub password: String,
}

/// `etcdserverpb.AuthenticateResponse`: the token every later request carries.
#[derive(Clone, PartialEq, prost::Message)]
pub struct AuthenticateResponse {
    /// The store's revision.
    #[prost(message, optional, tag = "1")]
    pub header: Option<ResponseHeader>,
    /// The token, sent in each request's `token` metadata.
    #[prost(string, tag = "2")]
    pub token: String,
}

/// `etcdserverpb.AuthUserAddRequest` (`Auth/UserAdd`): a new user with a password.
#[derive(Clone, PartialEq, prost::Message)]
pub struct AuthUserAddRequest {
    /// The user name.
    #[prost(string, tag = "1")]
    pub name: String,
    /// The password.
    #[prost(string, tag = "2")]
    pub password: String,
}

/// `etcdserverpb.AuthUserChangePasswordRequest` (`Auth/UserChangePassword`): a user's new
/// password (etcd then invalidates the user's tokens).
#[derive(Clone, PartialEq, prost::Message)]
pub struct AuthUserChangePasswordRequest {
    /// The user name.
    #[prost(string, tag = "1")]
    pub name: String,
    /// The new password.
    #[prost(string, tag = "2")]
    pub password: String,
}

/// `etcdserverpb.AuthUserGrantRoleRequest` (`Auth/UserGrantRole`).
#[derive(Clone, PartialEq, prost::Message)]
pub struct AuthUserGrantRoleRequest {
    /// The user name.
    #[prost(string, tag = "1")]
    pub user: String,
    /// The role granted (`root`: everything, and what enabling auth requires).
    #[prost(string, tag = "2")]
    pub role: String,
}

/// `etcdserverpb.AuthEnableRequest` (`Auth/AuthEnable`): no fields.
#[derive(Clone, PartialEq, prost::Message)]
pub struct AuthEnableRequest {}

/// The answer of the `Auth` calls that return only a header (`UserAdd`, `UserGrantRole`,
/// `AuthEnable`: their messages differ in name only).
#[derive(Clone, PartialEq, prost::Message)]
pub struct AuthResponse {
    /// The store's revision.
    #[prost(message, optional, tag = "1")]
    pub header: Option<ResponseHeader>,
}

macro_rules! revision {
    ($($t:ty),*) => {$(
        impl $t {
            /// The store's revision in the header (0 without a header).
            pub fn revision(&self) -> i64 {
                self.header.as_ref().map_or(0, |h| h.revision)
            }
        }
    )*};
}
revision!(
    RangeResponse,
    PutResponse,
    DeleteRangeResponse,
    TxnResponse,
    CompactionResponse,
    WatchResponse
);

impl RangeResponse {
    /// The first key found, if any.
    pub fn into_first(self) -> Option<KeyValue> {
        self.kvs.into_iter().next()
    }
}

impl TxnResponse {
    /// The first read's answer among the operations that ran.
    pub fn first_range(&self) -> Option<&RangeResponse> {
        self.responses.iter().find_map(|op| match &op.response {
            Some(response_op::Response::ResponseRange(r)) => Some(r),
            _ => None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message as _;

    fn encoded(m: &impl prost::Message) -> Vec<u8> {
        m.encode_to_vec()
    }

    #[test]
    fn a_compare_at_revision_0_still_sends_the_revision() {
        // etcd compares against the oneof's value: a missing one is not "0". Tag 6 (mod
        // revision) as a varint: 0x30, then 0.
        let bytes = encoded(&Compare::mod_revision("/k", 0));
        assert_eq!(bytes, [0x10, 0x02, 0x1a, 0x02, b'/', b'k', 0x30, 0x00]);
        let bytes = encoded(&Compare::create_revision("k", 7));
        assert_eq!(bytes, [0x10, 0x01, 0x1a, 0x01, b'k', 0x28, 0x07]);
    }

    #[test]
    fn a_txn_encodes_its_operations_in_their_fields() {
        let txn = TxnRequest {
            compare: vec![Compare::mod_revision("k", 3)],
            success: vec![RequestOp::put("k", "v")],
            failure: vec![RequestOp::range("k")],
        };
        let bytes = encoded(&txn);
        #[rustfmt::skip]
        let expected = [
            0x0a, 7, 0x10, 0x02, 0x1a, 0x01, b'k', 0x30, 0x03,     // compare
            0x12, 8, 0x12, 6, 0x0a, 1, b'k', 0x12, 1, b'v',        // success: request_put
            0x1a, 5, 0x0a, 3, 0x0a, 1, b'k',                       // failure: request_range
        ];
        assert_eq!(bytes, expected);
        assert_eq!(TxnRequest::decode(&bytes[..]).expect("decodes"), txn);
    }

    #[test]
    fn a_watch_response_decodes_with_the_fields_left_out_skipped() {
        #[rustfmt::skip]
        let bytes = [
            // header: cluster_id 1, member_id 2, revision 9, raft_term 4
            0x0a, 8, 0x08, 1, 0x10, 2, 0x18, 9, 0x20, 4,
            0x10, 5,                                   // watch_id 5
            0x28, 3,                                   // compact_revision 3
            0x38, 1,                                   // fragment (left out)
            // events[0]: DELETE, kv {key "k", mod_revision 9}, prev_kv {lease 7 only}
            0x5a, 13, 0x08, 1, 0x12, 5, 0x0a, 1, b'k', 0x18, 9, 0x1a, 2, 0x30, 7,
        ];
        let r = WatchResponse::decode(&bytes[..]).expect("decodes");
        assert_eq!(r.revision(), 9);
        assert_eq!((r.watch_id, r.compact_revision), (5, 3));
        assert_eq!(r.events.len(), 1);
        let e = &r.events[0];
        assert_eq!(e.r#type(), event::EventType::Delete);
        let kv = e.kv.as_ref().expect("kv");
        assert_eq!((kv.key.as_slice(), kv.mod_revision), (&b"k"[..], 9));
        assert_eq!(e.prev_kv, Some(KeyValue::default()));
    }

    #[test]
    fn a_watch_create_request_is_field_1_of_the_request() {
        let request = WatchRequest {
            request_union: Some(watch_request::RequestUnion::CreateRequest(
                WatchCreateRequest {
                    key: b"k".to_vec(),
                    start_revision: 300,
                    ..Default::default()
                },
            )),
        };
        // 300 as a varint: 0xac 0x02.
        assert_eq!(
            encoded(&request),
            [0x0a, 6, 0x0a, 1, b'k', 0x18, 0xac, 0x02]
        );
    }
}
