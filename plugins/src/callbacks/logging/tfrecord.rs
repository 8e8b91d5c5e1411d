//! TFRecord framing, the container of TensorBoard event files.
//!
//! A record is `u64 length (LE) · u32 masked_crc32c(length bytes) · data ·
//! u32 masked_crc32c(data)`, where `masked(c) = rotate_right(c, 15) + 0xa282ead8` (TensorFlow's
//! `crc32c::Mask`) and CRC-32C is the Castagnoli CRC (reflected polynomial `0x82F63B78`).

/// CRC-32C (Castagnoli) of `data`, from the `crc32c` crate.
pub fn crc32c(data: &[u8]) -> u32 {
    crc32c::crc32c(data)
}

/// The masked CRC-32C TFRecord files store.
pub fn masked_crc32c(data: &[u8]) -> u32 {
    let c = crc32c(data);
    c.rotate_right(15).wrapping_add(0xa282_ead8)
}

/// Frame `data` as one TFRecord.
pub fn tfrecord(data: &[u8]) -> Vec<u8> {
    let len = (data.len() as u64).to_le_bytes();
    let mut out = Vec::with_capacity(data.len() + 16);
    out.extend_from_slice(&len);
    out.extend_from_slice(&masked_crc32c(&len).to_le_bytes());
    out.extend_from_slice(data);
    out.extend_from_slice(&masked_crc32c(data).to_le_bytes());
    out
}

/// Split a byte string into the data of its records, as `(byte offset, data)`, checking both
/// CRCs of every record.
pub fn read_records(bytes: &[u8]) -> Result<Vec<(usize, &[u8])>, String> {
    let bad = |offset: usize, what: &str| format!("record at byte {offset}: {what}");
    let u32_at = |b: &[u8]| u32::from_le_bytes(b.try_into().expect("4 bytes"));
    let mut out = Vec::new();
    let mut pos = 0;
    while pos < bytes.len() {
        let header = bytes
            .get(pos..pos + 12)
            .ok_or_else(|| bad(pos, "truncated header"))?;
        if u32_at(&header[8..12]) != masked_crc32c(&header[..8]) {
            return Err(bad(pos, "length CRC mismatch"));
        }
        let len = u64::from_le_bytes(header[..8].try_into().expect("8 bytes")) as usize;
        let data = bytes
            .get(pos + 12..pos + 12 + len)
            .ok_or_else(|| bad(pos, "truncated data"))?;
        let crc = bytes
            .get(pos + 12 + len..pos + 16 + len)
            .ok_or_else(|| bad(pos, "truncated data CRC"))?;
        if u32_at(crc) != masked_crc32c(data) {
            return Err(bad(pos, "data CRC mismatch"));
        }
        out.push((pos, data));
        pos += 16 + len;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc32c_matches_known_vectors() {
        // RFC 3720 (iSCSI) appendix B.4 and the classic check value.
        assert_eq!(crc32c(b"123456789"), 0xE306_9283);
        assert_eq!(crc32c(&[0u8; 32]), 0x8A91_36AA);
        assert_eq!(crc32c(&[0xffu8; 32]), 0x62A8_AB43);
        let inc: Vec<u8> = (0..32).collect();
        assert_eq!(crc32c(&inc), 0x46DD_794E);
        let dec: Vec<u8> = (0..32).rev().collect();
        assert_eq!(crc32c(&dec), 0x113F_DB5C);
        assert_eq!(crc32c(b""), 0);
        // The mask of TensorFlow's crc32c::Mask (values from an independent bitwise
        // implementation), and the frame of an empty record.
        assert_eq!(crc32c(b"foo"), 0xCFC4_AE1D);
        assert_eq!(masked_crc32c(b"foo"), 0xFEBE_8A61);
        let empty = tfrecord(b"");
        assert_eq!(empty[..8], [0; 8]);
        assert_eq!(empty[8..12], 0x0798_0329u32.to_le_bytes());
        assert_eq!(empty[12..], masked_crc32c(b"").to_le_bytes());
    }

    #[test]
    fn records_round_trip_and_corruption_is_detected() {
        let mut bytes = tfrecord(b"hello");
        bytes.extend(tfrecord(b""));
        bytes.extend(tfrecord(&[7u8; 300]));
        let records = read_records(&bytes).unwrap();
        let data: Vec<&[u8]> = records.iter().map(|r| r.1).collect();
        assert_eq!(data, [&b"hello"[..], &b""[..], &[7u8; 300][..]]);
        assert_eq!(records[1].0, 21);
        for (at, what) in [
            (0, "length CRC"),
            (13, "data CRC"),
            (bytes.len() - 1, "data CRC"),
        ] {
            let mut bad = bytes.clone();
            bad[at] ^= 1;
            let err = read_records(&bad).unwrap_err();
            assert!(err.contains(what), "byte {at}: {err}");
        }
        assert!(read_records(&bytes[..bytes.len() - 2])
            .unwrap_err()
            .contains("truncated"));
    }
}
