//! User text quoted in error messages, cut short: a policy file of one 10 MB line makes
//! an error of a few hundred bytes, not one that repeats the line.

/// The longest stretch of a user's text an error quotes, in bytes.
pub(crate) const ECHO: usize = 64;

/// The start of `text`, at most `max` bytes (cut at a character boundary), and its full
/// length when it was cut.
fn head(text: &str, max: usize) -> (&str, Option<usize>) {
    if text.len() <= max {
        return (text, None);
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    (&text[..end], Some(text.len()))
}

/// `text` as an error keeps it: cut after `max` bytes, saying how long it was, so that a
/// huge input never makes a huge message.
pub(crate) fn cut(text: &str, max: usize) -> String {
    match head(text, max) {
        (all, None) => all.to_owned(),
        (start, Some(len)) => format!("{start}... ({len} bytes)"),
    }
}

/// User text as an error message quotes it: in quotes, cut after [`ECHO`] bytes.
pub(crate) fn echo(text: &str) -> String {
    match head(text, ECHO) {
        (all, None) => format!("{all:?}"),
        (start, Some(len)) => format!("{start:?}... ({len} bytes)"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_text_is_kept_and_long_text_cut_at_a_character() {
        assert_eq!(echo("10/mni"), "\"10/mni\"");
        assert_eq!(cut("10/mni", ECHO), "10/mni");
        let long = format!("{}é{}", "a".repeat(ECHO - 1), "b".repeat(1000));
        // The 64th byte is inside `é`: the cut falls before it.
        let shown = format!("\"{}\"... (1065 bytes)", "a".repeat(ECHO - 1));
        assert_eq!(echo(&long), shown);
        assert_eq!(
            cut(&long, ECHO),
            format!("{}... (1065 bytes)", "a".repeat(ECHO - 1))
        );
    }
}
