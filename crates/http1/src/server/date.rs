//! The `Date` header's value, formatted once a second per thread (RFC 9110 §6.6.1: an
//! origin server with a clock sends it; the gateway adds it when the upstream did not).

use std::cell::RefCell;
use std::time::{Duration, UNIX_EPOCH};

use rustix::time::{ClockId, clock_gettime};

thread_local! {
    static CACHED: RefCell<(i64, String)> = const { RefCell::new((i64::MIN, String::new())) };
}

/// Appends the current date, `Sun, 06 Nov 1994 08:49:37 GMT`.
pub(super) fn append(out: &mut Vec<u8>) {
    // The coarse clock (the kernel's last tick, a few ms old): a header with one-second
    // resolution needs no more, and it costs a fraction of a precise read.
    let second = clock_gettime(ClockId::RealtimeCoarse).tv_sec;
    CACHED.with_borrow_mut(|(at, text)| {
        if *at != second {
            *at = second;
            let since_epoch = Duration::from_secs(u64::try_from(second).unwrap_or(0));
            *text = httpdate::fmt_http_date(UNIX_EPOCH + since_epoch);
        }
        out.extend_from_slice(text.as_bytes());
    });
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_date_is_an_imf_fixdate_within_a_few_seconds_of_now() {
        let mut out = Vec::new();
        super::append(&mut out);
        let text = String::from_utf8(out).expect("ascii");
        assert_eq!(text.len(), 29, "{text}");
        assert!(text.ends_with(" GMT"), "{text}");
        let parsed = httpdate::parse_http_date(&text).expect("an HTTP date");
        let now = std::time::SystemTime::now();
        let skew = now.duration_since(parsed).unwrap_or_else(|e| e.duration());
        assert!(skew.as_secs() <= 5, "{text} is {skew:?} from now");
    }
}
