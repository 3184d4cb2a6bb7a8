//! Property test: random but well-formed profiles (random trees, recursion,
//! shared names, negative values, several trees and counters) through every
//! report and option, checking invariants instead of snapshots: no panic,
//! the total equals the sum of the self column, and every function of the
//! flat self table is in the call graph.

use igprof_analyse::{filters, run, Config, Output};

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// A random profile and the sum of its MEM_TOTAL values.
fn random_profile(rng: &mut Rng) -> (String, i64) {
    let hex = rng.below(2) == 0;
    let num = |v: i64| if hex { format!("{v:x}") } else { v.to_string() };
    let mut text = format!(
        "P=({}ID=1 N=(p) T=0.010000)\n",
        if hex { "HEX " } else { "" }
    );
    let nfun = 1 + rng.below(12) as usize;
    let mut defined = vec![false; nfun];
    let mut files_defined = [false; 3];
    let mut counters_defined = [false; 2];
    let mut depth = 0u64;
    let mut total = 0;
    for _ in 0..1 + rng.below(200) {
        depth = if depth == 0 {
            1
        } else {
            1 + rng.below(depth + 1)
        };
        let f = rng.below(nfun as u64) as usize;
        let fun = if defined[f] {
            format!("FN{}", num(f as i64))
        } else {
            defined[f] = true;
            let file = f % 3;
            let fdef = if files_defined[file] {
                format!("F{}", num(file as i64))
            } else {
                files_defined[file] = true;
                format!("F{}=(/nonexistent/lib{file}.so)", num(file as i64))
            };
            let name = match f % 4 {
                0 => format!("_Z4fun{f}v"),
                1 => "malloc".to_string(),
                _ => format!("fun{f}"),
            };
            format!(
                "FN{}=({fdef}+{} N=({name}))",
                num(f as i64),
                num(16 * f as i64 + 16)
            )
        };
        let mut line = format!("C{} {fun}+0", num(depth as i64));
        for c in 0..2 {
            if rng.below(3) == 0 {
                let name = ["MEM_TOTAL", "MEM_LIVE"][c];
                let v = rng.below(1000) as i64 - 100;
                if c == 0 {
                    total += v;
                }
                let def = if counters_defined[c] {
                    String::new()
                } else {
                    format!("=({name})")
                };
                counters_defined[c] = true;
                let value = if v < 0 {
                    format!("-{}", num(-v))
                } else {
                    num(v)
                };
                line.push_str(&format!(" V{c}{def}:({},{value},{})", num(1), num(7)));
                if c == 1 && rng.below(2) == 0 {
                    line.push_str(";LK=(0x1f,10)");
                }
            }
        }
        text.push_str(&line);
        text.push('\n');
    }
    (text, total)
}

fn report(cfg: &Config) -> String {
    let mut out = Vec::new();
    match run(cfg, &mut out, &mut |_| {}) {
        Ok(()) => String::from_utf8(out).unwrap(),
        Err(e) => format!("error: {e}"),
    }
}

#[test]
fn random_profiles_through_every_report() {
    let dir = tempfile::tempdir().unwrap();
    let mut rng = Rng(0x2545_f491_4f6c_dd1d);
    for case in 0..300 {
        let (text, total) = random_profile(&mut rng);
        let path = dir.path().join(format!("p{case}.txt"));
        std::fs::write(&path, &text).unwrap();
        let file = path.to_str().unwrap().to_string();
        let base = Config {
            files: vec![file.clone()],
            key: Some("MEM_TOTAL".into()),
            ..Config::default()
        };
        let plain = report(&Config {
            no_filter: true,
            ..base.clone()
        });
        assert!(!plain.starts_with("error: "), "{plain}\n{text}");
        if !text.contains("(MEM_TOTAL)") {
            // No value of the counter: IgProf's empty report, no rows.
            assert!(!plain.contains(" ["), "{plain}\n{text}");
            continue;
        }
        // Without filters nothing is dropped: the root's total is the sum.
        let root = plain
            .lines()
            .find(|l| l.contains("<spontaneous> ["))
            .unwrap();
        let shown: i64 = root
            .split_whitespace()
            .nth(1)
            .unwrap()
            .replace('\'', "")
            .parse()
            .unwrap();
        assert_eq!(shown, total, "{text}\n{plain}");
        // Every ranked function of the self table has its call-graph entry.
        let self_table = plain
            .split("Flat profile (self")
            .nth(1)
            .unwrap()
            .split("Call tree")
            .next()
            .unwrap();
        let graph = plain.split("Call tree profile").nth(1).unwrap();
        for line in self_table.lines().filter(|l| l.ends_with(']')) {
            let rank = &line[line.rfind('[').unwrap()..];
            assert!(
                graph.lines().any(|g| g.starts_with(rank)),
                "{rank} missing\n{plain}"
            );
        }
        for cfg in [
            base.clone(),
            Config {
                merge_libraries: true,
                ..base.clone()
            },
            Config {
                merge_regexp: filters::parse_merge_regexp("s/fun([0-9])/F\\1/").unwrap(),
                ..base.clone()
            },
            Config {
                merge_ancestors: Some(filters::parse_merge_ancestors("fun2>fun3/X").unwrap()),
                ..base.clone()
            },
            Config {
                top: 3,
                ..base.clone()
            },
            Config {
                tree: true,
                ..base.clone()
            },
            Config {
                output: Output::Json,
                ..base.clone()
            },
            Config {
                output: Output::Sql,
                ..base.clone()
            },
            Config {
                demangle: true,
                show_paths: true,
                show_libs: true,
                ..base.clone()
            },
            Config {
                key: Some("MEM_LIVE".into()),
                read: igprof_analyse::profile::ReadOptions {
                    peak: true,
                    ..Default::default()
                },
                ..base.clone()
            },
            Config {
                baseline: Some(file.clone()),
                diff_mode: true,
                ..base.clone()
            },
        ] {
            let _ = report(&cfg);
        }
    }
}
