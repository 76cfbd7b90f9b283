//! Wall-clock timestamps as nginx prints them, cached per second on each thread.
//!
//! Hand-written because the two formats are fixed-width and the civil-date arithmetic is
//! a dozen lines; a date crate would add a dependency to the hot path for no gain. Times
//! are printed in UTC (`+0000`): the gateway has no time-zone database, and UTC logs sort
//! and merge across hosts.

use std::time::{SystemTime, UNIX_EPOCH};

const MONTHS: [&[u8; 3]; 12] = [
    b"Jan", b"Feb", b"Mar", b"Apr", b"May", b"Jun", b"Jul", b"Aug", b"Sep", b"Oct", b"Nov", b"Dec",
];

/// The two renderings of the last second seen by this thread.
#[derive(Debug, Clone)]
pub(crate) struct TimeCache {
    secs: u64,
    /// `21/Nov/2026:21:19:53 +0000`
    local: [u8; 26],
    /// `2026-11-21T21:19:53+00:00`
    iso: [u8; 25],
}

impl Default for TimeCache {
    fn default() -> Self {
        let mut cache = Self {
            secs: u64::MAX,
            local: [0; 26],
            iso: [0; 25],
        };
        cache.render(0);
        cache
    }
}

pub(crate) fn unix(t: SystemTime) -> std::time::Duration {
    // A clock before 1970 is a broken clock; print the epoch rather than fail.
    t.duration_since(UNIX_EPOCH).unwrap_or_default()
}

impl TimeCache {
    /// nginx `$time_local` (in UTC).
    pub(crate) fn local(&mut self, t: SystemTime) -> &[u8; 26] {
        self.update(t);
        &self.local
    }

    /// nginx `$time_iso8601` (in UTC).
    pub(crate) fn iso(&mut self, t: SystemTime) -> &[u8; 25] {
        self.update(t);
        &self.iso
    }

    #[inline]
    fn update(&mut self, t: SystemTime) {
        let secs = unix(t).as_secs();
        if secs != self.secs {
            self.render(secs);
        }
    }

    fn render(&mut self, secs: u64) {
        self.secs = secs;
        let days = secs / 86_400;
        let rem = secs % 86_400;
        let (y, m, d) = civil_from_days(days);
        let (hh, mm, ss) = (rem / 3600, rem / 60 % 60, rem % 60);
        let y = y.min(9999);
        let mut l = [0u8; 26];
        put2(&mut l[0..2], d);
        l[2] = b'/';
        l[3..6].copy_from_slice(MONTHS[(m - 1) as usize]);
        l[6] = b'/';
        put4(&mut l[7..11], y);
        l[11] = b':';
        put2(&mut l[12..14], hh);
        l[14] = b':';
        put2(&mut l[15..17], mm);
        l[17] = b':';
        put2(&mut l[18..20], ss);
        l[20..26].copy_from_slice(b" +0000");
        self.local = l;
        let mut i = [0u8; 25];
        put4(&mut i[0..4], y);
        i[4] = b'-';
        put2(&mut i[5..7], m);
        i[7] = b'-';
        put2(&mut i[8..10], d);
        i[10] = b'T';
        put2(&mut i[11..13], hh);
        i[13] = b':';
        put2(&mut i[14..16], mm);
        i[16] = b':';
        put2(&mut i[17..19], ss);
        i[19..25].copy_from_slice(b"+00:00");
        self.iso = i;
    }
}

fn put2(out: &mut [u8], v: u64) {
    out[0] = b'0' + (v / 10 % 10) as u8;
    out[1] = b'0' + (v % 10) as u8;
}

fn put4(out: &mut [u8], v: u64) {
    put2(&mut out[0..2], v / 100);
    put2(&mut out[2..4], v % 100);
}

/// Howard Hinnant's `civil_from_days`, for days since 1970-01-01 (never negative here).
fn civil_from_days(days: u64) -> (u64, u64, u64) {
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z % 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + u64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn at(secs: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(secs)
    }

    #[test]
    fn formats_known_instants() {
        let mut c = TimeCache::default();
        assert_eq!(c.local(at(0)), b"01/Jan/1970:00:00:00 +0000");
        assert_eq!(c.iso(at(0)), b"1970-01-01T00:00:00+00:00");
        // 2026-11-21T21:19:53Z
        assert_eq!(c.local(at(1_795_295_993)), b"21/Nov/2026:21:19:53 +0000");
        assert_eq!(c.iso(at(1_795_295_993)), b"2026-11-21T21:19:53+00:00");
        // Leap day 2024-02-29T12:00:00Z.
        assert_eq!(c.iso(at(1_709_208_000)), b"2024-02-29T12:00:00+00:00");
        // End of a year: 2023-12-31T23:59:59Z.
        assert_eq!(c.local(at(1_704_067_199)), b"31/Dec/2023:23:59:59 +0000");
    }

    #[test]
    fn agrees_with_day_count_for_every_day_of_four_centuries() {
        // Walk day by day and check month/day roll over like a calendar.
        let (mut y, mut m, mut d) = (1970u64, 1u64, 1u64);
        for days in 0..146_097u64 {
            assert_eq!(civil_from_days(days), (y, m, d), "day {days}");
            let leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
            let len = [
                31,
                if leap { 29 } else { 28 },
                31,
                30,
                31,
                30,
                31,
                31,
                30,
                31,
                30,
                31,
            ];
            d += 1;
            if d > len[(m - 1) as usize] {
                d = 1;
                m += 1;
                if m > 12 {
                    m = 1;
                    y += 1;
                }
            }
        }
    }
}
