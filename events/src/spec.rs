//! The grammar of an event specification (`-e SPEC`):
//!
//! ```text
//! SPEC   := NAME [':' MODS] ['/' PERIOD]          page-faults, cycles:u/100000, cycles/F999
//!         | 'r' HEX [':' MODS] ['/' PERIOD]       r01c2 (raw config of the CPU PMU)
//!         | PMU '/' TERMS '/' [':'] [MODS]        cpu/event=0xc0,umask=0/, msr/tsc/u
//! TERMS  := TERM (',' TERM)*
//! TERM   := NAME ['=' NUMBER]                     event=0x3c, edge, cache-misses, period=1000
//! PERIOD := NUMBER ['k' | 'M']                    events per sample
//!         | 'F' NUMBER                            samples per second (the kernel varies the period)
//! MODS   := ('u' | 'k' | 'h' | 'p')*              user, kernel, hypervisor, precise (p..ppp)
//! NUMBER := decimal | 0x hex
//! ```
//!
//! as `perf record -e` reads them, with igprof's `/PERIOD` after a name (a
//! PMU event takes perf's own `period=` and `freq=` terms).

use core::fmt;

/// One `-e` specification, parsed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Spec {
    /// The specification as given (for messages).
    pub text: String,
    pub event: Event,
    /// Modifiers given: count in user / kernel / hypervisor mode (none
    /// given: the caller's default), and how precise the sampled PC must
    /// be (`p` to `ppp`, perf's `precise_ip` 1 to 3).
    pub user: bool,
    pub kernel: bool,
    pub hv: bool,
    pub precise: u8,
    /// Events per sample, if given (else the caller's default).
    pub period: Option<Period>,
}

/// What to count.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// A name: a generic hardware, software or hardware-cache event
    /// (`cycles`, `page-faults`, `L1-dcache-load-misses`), or an event a
    /// PMU names in its sysfs `events/` directory.
    Named(String),
    /// `rNNNN`: a raw event code of the CPU's PMU (`PERF_TYPE_RAW`).
    Raw(u64),
    /// `pmu/terms/`: terms of the PMU's `format/` fields or `events/` names.
    Pmu { pmu: String, terms: Vec<Term> },
}

/// One `name[=value]` of a PMU specification.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Term {
    pub name: String,
    pub value: Option<u64>,
}

/// How often a sample is taken.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Period {
    /// Every this many events.
    Count(u64),
    /// This many samples per second of the thread's time, the kernel
    /// adjusting the period as the event's rate changes.
    Frequency(u64),
}

/// Why a specification does not parse (one line, naming the problem).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SpecError {
    pub spec: String,
    pub why: String,
}

impl fmt::Display for SpecError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "event '{}': {}", self.spec, self.why)
    }
}

impl std::error::Error for SpecError {}

fn is_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.')
}

/// A decimal or `0x` hexadecimal number.
fn number(s: &str) -> Option<u64> {
    match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(h) if !h.is_empty() && h.chars().all(|c| c.is_ascii_hexdigit()) => {
            u64::from_str_radix(h, 16).ok()
        }
        Some(_) => None,
        None if !s.is_empty() && s.chars().all(|c| c.is_ascii_digit()) => s.parse().ok(),
        None => None,
    }
}

impl Spec {
    /// The counter this event's samples go to in the profile: `EV_` and
    /// the event in capitals, every run of other characters than letters
    /// and digits as one `_`, the modifiers last (`page-faults` ->
    /// `EV_PAGE_FAULTS`, `cpu/event=0xc0/u` -> `EV_CPU_EVENT_0XC0_U`): a
    /// name IgProf's analyser accepts, and one `-r` option can name.
    pub fn counter_name(&self) -> String {
        let core: String = match self.event {
            // A PMU specification's event ends at its second '/'; its
            // period= and freq= terms are not what it counts.
            Event::Pmu { .. } => {
                let end = self
                    .text
                    .match_indices('/')
                    .nth(1)
                    .map_or(self.text.len(), |(i, _)| i);
                let (pmu, terms) = self.text[..end]
                    .split_once('/')
                    .unwrap_or((&self.text[..end], ""));
                let kept: Vec<&str> = terms
                    .split(',')
                    .filter(|t| !is_rate(t.split('=').next().unwrap_or("")))
                    .collect();
                format!("{pmu}/{}", kept.join(","))
            }
            _ => self
                .text
                .split([':', '/'])
                .next()
                .unwrap_or(&self.text)
                .to_string(),
        };
        let mods: String = [(self.user, 'u'), (self.kernel, 'k'), (self.hv, 'h')]
            .iter()
            .filter_map(|&(on, c)| on.then_some(c))
            .chain(core::iter::repeat_n('p', self.precise as usize))
            .collect();
        let mut out = String::from("EV_");
        let mut gap = false;
        for c in core.chars().chain([':']).chain(mods.chars()) {
            if !c.is_ascii_alphanumeric() {
                gap = true;
                continue;
            }
            if gap && !out.ends_with('_') {
                out.push('_');
            }
            gap = false;
            out.push(c.to_ascii_uppercase());
        }
        out
    }
}

/// Parses one specification (see the module docs).
pub fn parse(text: &str) -> Result<Spec, SpecError> {
    let fail = |why: String| SpecError {
        spec: text.to_string(),
        why,
    };
    if text.is_empty() {
        return Err(fail(
            "empty: name an event (e.g. page-faults, cycles, cpu/event=0xc0/)".into(),
        ));
    }
    if let Some(bad) = text
        .chars()
        .find(|c| c.is_whitespace() || *c == '\'' || c.is_control())
    {
        return Err(fail(format!("{bad:?} cannot appear in an event")));
    }
    let mut spec = Spec {
        text: text.to_string(),
        event: Event::Raw(0),
        user: false,
        kernel: false,
        hv: false,
        precise: 0,
        period: None,
    };
    let (head, tail) = match text.split_once('/') {
        Some((h, t)) => (h, Some(t)),
        None => (text, None),
    };
    match tail {
        Some(rest) if rest.contains('/') => {
            // pmu/terms/[:]mods
            let (terms, after) = rest.split_once('/').expect("checked above");
            if head.is_empty() || !head.chars().all(is_name_char) {
                return Err(fail(format!("'{head}' is not a PMU name")));
            }
            let terms = parse_terms(terms).map_err(fail)?;
            let mods = after.strip_prefix(':').unwrap_or(after);
            modifiers(&mut spec, mods).map_err(fail)?;
            for t in &terms {
                if t.name == "period" {
                    match t.value {
                        Some(p) if p > 0 => spec.period = Some(Period::Count(p)),
                        _ => return Err(fail("period= needs a number above 0".into())),
                    }
                }
                if t.name == "freq" {
                    match t.value {
                        Some(f) if f > 0 => spec.period = Some(Period::Frequency(f)),
                        _ => return Err(fail("freq= needs a number above 0".into())),
                    }
                }
            }
            spec.event = Event::Pmu {
                pmu: head.to_string(),
                terms: terms.into_iter().filter(|t| !is_rate(&t.name)).collect(),
            };
        }
        _ => {
            let (name, mods) = match head.split_once(':') {
                Some((n, m)) => (n, Some(m)),
                None => (head, None),
            };
            if name.is_empty() || !name.chars().all(is_name_char) {
                return Err(fail(format!(
                    "'{name}' is not an event name (letters, digits, '-', '_', '.')"
                )));
            }
            if let Some(m) = mods {
                modifiers(&mut spec, m).map_err(fail)?;
            }
            if let Some(p) = tail {
                spec.period = Some(period(p).map_err(fail)?);
            }
            let raw = name.strip_prefix('r').filter(|h| {
                !h.is_empty() && h.len() <= 16 && h.chars().all(|c| c.is_ascii_hexdigit())
            });
            spec.event = match raw {
                Some(h) => Event::Raw(u64::from_str_radix(h, 16).expect("checked hex digits")),
                None => Event::Named(name.to_string()),
            };
        }
    }
    Ok(spec)
}

/// Splits a comma-separated list of specifications (`-c`), where a PMU
/// specification's own commas (between its two slashes) do not split:
/// `cycles,cpu/event=0xc0,umask=0/,page-faults` is three.
pub fn split_list(list: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let (mut start, mut inside) = (0, false);
    for (i, c) in list.char_indices() {
        match c {
            '/' => inside = !inside,
            ',' if !inside => {
                out.push(&list[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&list[start..]);
    out
}

/// perf's terms that say how often to sample, not what to count.
fn is_rate(term: &str) -> bool {
    term == "period" || term == "freq"
}

fn period(p: &str) -> Result<Period, String> {
    if let Some(f) = p.strip_prefix(['F', 'f']) {
        return match number(f) {
            Some(n) if n > 0 && n <= 1_000_000 => Ok(Period::Frequency(n)),
            _ => Err(format!(
                "'{p}' is not a frequency: F and samples per second, 1 to 1000000 (F999)"
            )),
        };
    }
    let (digits, mul) = match p.strip_suffix('k') {
        Some(d) => (d, 1_000),
        None => match p.strip_suffix('M') {
            Some(d) => (d, 1_000_000),
            None => (p, 1),
        },
    };
    match number(digits).and_then(|n| n.checked_mul(mul)) {
        Some(n) if n > 0 && n < 1 << 63 => Ok(Period::Count(n)),
        _ => Err(format!(
            "'{p}' is not a period: events per sample, a number above 0 (1000, 10k, 1M)"
        )),
    }
}

fn parse_terms(s: &str) -> Result<Vec<Term>, String> {
    if s.is_empty() {
        return Err("no terms between the slashes (e.g. cpu/event=0xc0/)".into());
    }
    s.split(',')
        .map(|t| {
            let (name, value) = match t.split_once('=') {
                Some((n, v)) => (n, Some(v)),
                None => (t, None),
            };
            if name.is_empty() || !name.chars().all(is_name_char) {
                return Err(format!("'{t}' is not a term (name or name=value)"));
            }
            let value = match value {
                Some(v) => Some(number(v).ok_or_else(|| {
                    format!("'{v}' in '{t}' is not a number (decimal or 0x hexadecimal)")
                })?),
                None => None,
            };
            Ok(Term {
                name: name.to_string(),
                value,
            })
        })
        .collect()
}

fn modifiers(spec: &mut Spec, m: &str) -> Result<(), String> {
    for c in m.chars() {
        match c {
            'u' => spec.user = true,
            'k' => spec.kernel = true,
            'h' => spec.hv = true,
            'p' if spec.precise < 3 => spec.precise += 1,
            'p' => return Err("at most 3 p (ppp: zero skid)".into()),
            _ => {
                return Err(format!(
                    "'{c}' is not a modifier (u user, k kernel, h hypervisor, p precise)"
                ))
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn named(s: &str) -> Event {
        Event::Named(s.into())
    }

    #[test]
    fn names_periods_and_modifiers() {
        let s = parse("page-faults").unwrap();
        assert_eq!(
            (s.event, s.period, s.user, s.precise),
            (named("page-faults"), None, false, 0)
        );
        let s = parse("page-faults/100").unwrap();
        assert_eq!(s.period, Some(Period::Count(100)));
        let s = parse("cycles:upp/10k").unwrap();
        assert_eq!(
            (s.event, s.user, s.kernel, s.precise, s.period),
            (named("cycles"), true, false, 2, Some(Period::Count(10_000)))
        );
        assert_eq!(
            parse("instructions/2M").unwrap().period,
            Some(Period::Count(2_000_000))
        );
        assert_eq!(
            parse("cycles/F999").unwrap().period,
            Some(Period::Frequency(999))
        );
        let s = parse("cpu/event=0x3c,freq=4000/").unwrap();
        assert_eq!(s.period, Some(Period::Frequency(4000)));
        assert_eq!(s.counter_name(), "EV_CPU_EVENT_0X3C");
        assert_eq!(
            parse("cpu/period=10,event=0x3c/").unwrap().counter_name(),
            "EV_CPU_EVENT_0X3C"
        );
        assert_eq!(
            parse("L1-dcache-load-misses").unwrap().event,
            named("L1-dcache-load-misses")
        );
    }

    #[test]
    fn raw_codes_and_names_that_start_with_r() {
        assert_eq!(parse("r01c2").unwrap().event, Event::Raw(0x01c2));
        assert_eq!(parse("r1a3b:u").unwrap().event, Event::Raw(0x1a3b));
        assert_eq!(parse("ref-cycles").unwrap().event, named("ref-cycles"));
        assert_eq!(parse("r").unwrap().event, named("r"));
    }

    #[test]
    fn pmu_terms() {
        let s = parse("cpu/event=0xc0,umask=0,edge/").unwrap();
        assert_eq!(
            s.event,
            Event::Pmu {
                pmu: "cpu".into(),
                terms: vec![
                    Term {
                        name: "event".into(),
                        value: Some(0xc0)
                    },
                    Term {
                        name: "umask".into(),
                        value: Some(0)
                    },
                    Term {
                        name: "edge".into(),
                        value: None
                    },
                ]
            }
        );
        let s = parse("cpu/cache-misses,period=5000/u").unwrap();
        assert_eq!(s.period, Some(Period::Count(5000)));
        assert!(s.user);
        assert_eq!(
            s.event,
            Event::Pmu {
                pmu: "cpu".into(),
                terms: vec![Term {
                    name: "cache-misses".into(),
                    value: None
                }]
            }
        );
        assert!(parse("msr/tsc/:k").unwrap().kernel);
    }

    #[test]
    fn mistakes_say_what_is_wrong() {
        for (spec, says) in [
            ("", "empty"),
            ("page faults", "cannot appear"),
            ("cycles/F0", "not a frequency"),
            ("cycles/Fx", "not a frequency"),
            ("cpu/event=0x3c,freq=0/", "freq= needs a number above 0"),
            ("cycles/0", "not a period"),
            ("cycles/ten", "not a period"),
            ("cycles:x", "'x' is not a modifier"),
            ("cycles:pppp", "at most 3 p"),
            ("cpu//", "no terms"),
            ("cpu/event=0xzz/", "not a number"),
            ("cpu/=3/", "not a term"),
            ("/event=1/", "not a PMU name"),
            ("cyc$les", "not an event name"),
        ] {
            let e = parse(spec).unwrap_err();
            assert!(e.to_string().contains(says), "{spec}: {e}");
            assert!(
                e.to_string().starts_with(&format!("event '{spec}': ")),
                "{e}"
            );
        }
    }

    #[test]
    fn lists_split_outside_pmu_terms() {
        assert_eq!(split_list("page-faults"), ["page-faults"]);
        assert_eq!(
            split_list("cycles,cpu/event=0xc0,umask=0/,page-faults"),
            ["cycles", "cpu/event=0xc0,umask=0/", "page-faults"]
        );
        assert_eq!(split_list("a,,b"), ["a", "", "b"]);
    }

    #[test]
    fn counter_names() {
        for (spec, name) in [
            ("page-faults", "EV_PAGE_FAULTS"),
            ("page-faults/100", "EV_PAGE_FAULTS"),
            ("L1-dcache-load-misses", "EV_L1_DCACHE_LOAD_MISSES"),
            ("cycles:upp/1000", "EV_CYCLES_UPP"),
            ("cpu/event=0xc0,umask=0/", "EV_CPU_EVENT_0XC0_UMASK_0"),
            ("cpu/event=0xc0/u", "EV_CPU_EVENT_0XC0_U"),
            ("r01c2", "EV_R01C2"),
            ("msr/tsc/", "EV_MSR_TSC"),
        ] {
            assert_eq!(parse(spec).unwrap().counter_name(), name, "{spec}");
        }
    }
}
