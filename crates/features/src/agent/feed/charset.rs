//! A fetched document's bytes as UTF-8. The encoding comes from, in order: a byte-order
//! mark, the XML declaration, the HTTP `Content-Type` charset, and else chardetng's guess
//! (the detector Firefox uses). A declaration of UTF-8 that the bytes contradict is a
//! mislabel and falls through to the next source.
//!
//! The decoding happens here, not in the feed parser, because the HTTP charset never
//! reaches a parser that reads bytes; the XML declaration of the decoded text is then
//! rewritten to say UTF-8, so the parser does not decode it a second time.

use std::borrow::Cow;

use encoding_rs::{Encoding, UTF_16BE, UTF_16LE, UTF_8};

/// Where a document's encoding was read from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Basis {
    ByteOrderMark,
    XmlDeclaration,
    HttpCharset,
    Detected,
}

/// A document as text, and how its encoding was chosen.
#[derive(Debug)]
pub struct Decoded {
    pub text: String,
    pub encoding: &'static str,
    pub basis: Basis,
}

/// Decodes `bytes`; `http_charset` is the `charset` parameter the server sent, if any.
pub fn decode(bytes: &[u8], http_charset: Option<&str>) -> Decoded {
    if let Some((encoding, bom_len)) = Encoding::for_bom(bytes) {
        let (text, _) = encoding.decode_without_bom_handling(&bytes[bom_len..]);
        return decoded(&text, encoding, Basis::ByteOrderMark);
    }
    let declared = [
        (xml_declared_label(bytes), Basis::XmlDeclaration),
        (http_charset.map(str::to_string), Basis::HttpCharset),
    ];
    for (label, basis) in declared {
        let Some(encoding) = label.and_then(|l| Encoding::for_label(l.trim().as_bytes())) else {
            continue;
        };
        // Bytes readable this far as ASCII are not UTF-16, whatever the label says; and a
        // UTF-8 label on bytes that are not UTF-8 is the commonest mislabel there is.
        let contradicted = encoding == UTF_16LE
            || encoding == UTF_16BE
            || (encoding == UTF_8 && std::str::from_utf8(bytes).is_err());
        if contradicted {
            continue;
        }
        let (text, _) = encoding.decode_without_bom_handling(bytes);
        return decoded(&text, encoding, basis);
    }
    let encoding = match std::str::from_utf8(bytes) {
        Ok(_) => UTF_8,
        Err(_) => {
            let mut detector =
                chardetng::EncodingDetector::new(chardetng::Iso2022JpDetection::Deny);
            detector.feed(bytes, true);
            detector.guess(None, chardetng::Utf8Detection::Allow)
        }
    };
    let (text, _) = encoding.decode_without_bom_handling(bytes);
    decoded(&text, encoding, Basis::Detected)
}

fn decoded(text: &str, encoding: &'static Encoding, basis: Basis) -> Decoded {
    Decoded {
        text: declare_utf8(text).into_owned(),
        encoding: encoding.name(),
        basis,
    }
}

/// The XML declaration at the start of `bytes` (`<?xml … ?>`), if there is one.
fn xml_declaration(text: &str) -> Option<(usize, &str)> {
    let start = text.len() - text.trim_start().len();
    let rest = &text[start..];
    if !rest.starts_with("<?xml") {
        return None;
    }
    let end = rest.find("?>")?;
    Some((start, &rest[..end]))
}

/// The value of the declaration's `encoding` pseudo-attribute, and where it lies in it.
fn encoding_value(declaration: &str) -> Option<(usize, usize)> {
    let at = declaration.find("encoding")? + "encoding".len();
    let after = &declaration[at..];
    let eq = after.find('=')?;
    if !after[..eq].trim().is_empty() {
        return None;
    }
    let value = &after[eq + 1..];
    let open = value.len() - value.trim_start().len();
    let quote = value[open..]
        .chars()
        .next()
        .filter(|c| *c == '"' || *c == '\'')?;
    let from = at + eq + 1 + open + 1;
    let len = declaration[from..].find(quote)?;
    Some((from, from + len))
}

/// The encoding label an ASCII-compatible document declares.
fn xml_declared_label(bytes: &[u8]) -> Option<String> {
    let head = &bytes[..bytes.len().min(512)];
    // The declaration is ASCII; what follows it in `head` may be cut mid-character.
    let ascii_end = head
        .iter()
        .position(|b| !b.is_ascii())
        .unwrap_or(head.len());
    let head = std::str::from_utf8(&head[..ascii_end]).ok()?;
    let (_, declaration) = xml_declaration(head)?;
    let (from, to) = encoding_value(declaration)?;
    Some(declaration[from..to].to_string())
}

/// `text` with its XML declaration (if any) naming UTF-8, which it now is.
fn declare_utf8(text: &str) -> Cow<'_, str> {
    let Some((start, declaration)) = xml_declaration(text) else {
        return Cow::Borrowed(text);
    };
    let Some((from, to)) = encoding_value(declaration) else {
        return Cow::Borrowed(text);
    };
    Cow::Owned(format!(
        "{}UTF-8{}",
        &text[..start + from],
        &text[start + to..]
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    const LATIN1_DECLARED: &[u8] =
        b"<?xml version=\"1.0\" encoding=\"ISO-8859-1\"?><rss><channel><title>Caf\xe9</title></channel></rss>";

    #[test]
    fn the_xml_declaration_is_read_and_rewritten() {
        let d = decode(LATIN1_DECLARED, None);
        assert_eq!(d.basis, Basis::XmlDeclaration);
        assert_eq!(d.encoding, "windows-1252");
        assert!(d
            .text
            .starts_with("<?xml version=\"1.0\" encoding=\"UTF-8\"?>"));
        assert!(d.text.contains("Café"));
    }

    #[test]
    fn a_byte_order_mark_wins() {
        let mut utf16: Vec<u8> = vec![0xff, 0xfe];
        for unit in "<?xml version='1.0' encoding='iso-8859-1'?><a>é</a>".encode_utf16() {
            utf16.extend(unit.to_le_bytes());
        }
        let d = decode(&utf16, Some("koi8-r"));
        assert_eq!(d.basis, Basis::ByteOrderMark);
        assert_eq!(d.text, "<?xml version='1.0' encoding='UTF-8'?><a>é</a>");
    }

    #[test]
    fn the_http_charset_is_used_when_the_document_says_nothing() {
        let d = decode(
            b"<rss><title>\xcf\xf0\xe8\xe2\xe5\xf2</title></rss>",
            Some("windows-1251"),
        );
        assert_eq!(d.basis, Basis::HttpCharset);
        assert!(d.text.contains("Привет"), "{}", d.text);
    }

    #[test]
    fn undeclared_bytes_are_detected() {
        let text = "Привет, как дела? Это тестовая лента новостей на русском языке.";
        let (bytes, _, _) = encoding_rs::WINDOWS_1251.encode(text);
        let d = decode(&bytes, None);
        assert_eq!(d.basis, Basis::Detected);
        assert_eq!(d.text, text);
        assert_eq!(decode("plain ☃".as_bytes(), None).encoding, "UTF-8");
    }

    #[test]
    fn a_utf8_label_the_bytes_contradict_is_not_believed() {
        let d = decode(
            b"<?xml version=\"1.0\" encoding=\"utf-8\"?><a>na\xefve caf\xe9 r\xe9sum\xe9</a>",
            Some("utf-8"),
        );
        assert_eq!(d.basis, Basis::Detected);
        assert!(d.text.contains("naïve café résumé"), "{}", d.text);
    }

    #[test]
    fn odd_declarations_do_not_panic() {
        for bytes in [
            &b"<?xml"[..],
            b"<?xml encoding?>",
            b"<?xml encoding=?>",
            b"<?xml encoding=\"?>",
            b"<?xml encoding = 'x' ?>",
            b"  <?xml version=\"1.0\" encoding=\"nonsense\"?><a/>",
            b"\xff",
            b"",
        ] {
            let _ = decode(bytes, Some("\u{0}"));
        }
    }
}
