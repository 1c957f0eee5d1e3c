//! poolside_v1 reasoning split: with thinking on, the prompt ends in `<think>`, so the output is
//! reasoning up to `</think>` and content after it. With thinking off everything is content.
const THINK_START: &str = "<think>";
const THINK_END: &str = "</think>";

pub struct ReasoningSplitter {
    in_reasoning: bool,
    at_start: bool,
    buf: String,
    saw_reasoning: bool,
}

/// One step's split: (reasoning, content).
pub type Split = (String, String);

fn partial_suffix(buf: &str, tag: &str) -> usize {
    (1..tag.len())
        .rev()
        .find(|&i| buf.ends_with(&tag[..i]))
        .unwrap_or(0)
}

impl ReasoningSplitter {
    pub fn new(thinking: bool) -> ReasoningSplitter {
        ReasoningSplitter {
            in_reasoning: thinking,
            at_start: true,
            buf: String::new(),
            saw_reasoning: false,
        }
    }

    /// Whether any reasoning text was produced (so `reasoning` is a string, not null).
    pub fn has_reasoning(&self) -> bool {
        self.saw_reasoning
    }

    pub fn push(&mut self, text: &str) -> Split {
        if !self.in_reasoning {
            return (String::new(), text.to_string());
        }
        self.buf.push_str(text);
        if self.at_start {
            // A model may repeat the `<think>` the prompt already opened.
            if self.buf.len() < THINK_START.len() && THINK_START.starts_with(self.buf.as_str()) {
                return (String::new(), String::new());
            }
            if self.buf.starts_with(THINK_START) {
                self.buf.drain(..THINK_START.len());
            }
            self.at_start = false;
        }
        if let Some(i) = self.buf.find(THINK_END) {
            let reasoning = self.buf[..i].to_string();
            let content = self.buf[i + THINK_END.len()..].to_string();
            self.buf.clear();
            self.in_reasoning = false;
            self.saw_reasoning = true;
            return (reasoning, content);
        }
        let keep = partial_suffix(&self.buf, THINK_END);
        let reasoning: String = self.buf.drain(..self.buf.len() - keep).collect();
        if !reasoning.is_empty() {
            self.saw_reasoning = true;
        }
        (reasoning, String::new())
    }

    pub fn finish(&mut self) -> Split {
        let rest = std::mem::take(&mut self.buf);
        if self.in_reasoning {
            if !rest.is_empty() {
                self.saw_reasoning = true;
            }
            (rest, String::new())
        } else {
            (String::new(), rest)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(thinking: bool, parts: &[&str]) -> (String, String) {
        let mut s = ReasoningSplitter::new(thinking);
        let (mut r, mut c) = (String::new(), String::new());
        for p in parts.iter().copied() {
            let (a, b) = s.push(p);
            r += &a;
            c += &b;
        }
        let (a, b) = s.finish();
        (r + &a, c + &b)
    }

    #[test]
    fn splits_at_think_end() {
        assert_eq!(
            run(true, &["hmm", "</think>", "Hi"]),
            ("hmm".into(), "Hi".into())
        );
        assert_eq!(
            run(true, &["h", "mm</th", "ink>H", "i"]),
            ("hmm".into(), "Hi".into())
        );
        assert_eq!(
            run(true, &["<think>", "a</think>b"]),
            ("a".into(), "b".into())
        );
        assert_eq!(
            run(true, &["still thinking"]),
            ("still thinking".into(), "".into())
        );
        assert_eq!(
            run(false, &["hmm</think>Hi"]),
            ("".into(), "hmm</think>Hi".into())
        );
    }
}
