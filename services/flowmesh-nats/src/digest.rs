//! The object store's digest format, `SHA-256=<base64url>`, so readers can verify what they fetch.

use sha2::Digest;

/// The digest the object store records for `bytes`.
pub fn sha256(bytes: &[u8]) -> String {
    format!("SHA-256={}", base64url(&sha2::Sha256::digest(bytes)))
}

/// URL-safe base64 with padding, as the object store writes digests.
fn base64url(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let b = [chunk[0], *chunk.get(1).unwrap_or(&0), *chunk.get(2).unwrap_or(&0)];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[(n >> (18 - 6 * i)) as usize & 63] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn base64url_matches_rfc4648() {
        assert_eq!(super::base64url(b""), "");
        assert_eq!(super::base64url(b"f"), "Zg==");
        assert_eq!(super::base64url(b"fo"), "Zm8=");
        assert_eq!(super::base64url(b"foo"), "Zm9v");
        assert_eq!(super::base64url(&[0xfb, 0xff]), "-_8=");
    }
}
