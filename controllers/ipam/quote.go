package ipam

import (
	"fmt"
	"strconv"
	"unicode/utf8"
)

// QuotePrefixBytes is how much of a bad value an error message quotes. A value can be as long as
// its field allows (a 20,000-character spec.loadBalancerIP), while the message ends up in a
// condition and an Event whose note the API server caps at 1 KiB: a short prefix is enough to
// recognise the value, and it keeps every message short whatever the input.
const QuotePrefixBytes = 64

// Quote renders a user-supplied value for a message: Go-quoted (so control characters and
// invalid UTF-8 show as escapes and the result is valid UTF-8), and when longer than
// QuotePrefixBytes only its first QuotePrefixBytes bytes (cut at a character boundary) followed
// by `... (N bytes)`.
func Quote(s string) string {
	if len(s) <= QuotePrefixBytes {
		return strconv.Quote(s)
	}
	return fmt.Sprintf("%s... (%d bytes)", strconv.Quote(TruncateUTF8(s, QuotePrefixBytes)), len(s))
}

// TruncateUTF8 returns the longest prefix of s of at most n bytes that does not cut a UTF-8
// character in two. Invalid bytes count as one-byte characters.
func TruncateUTF8(s string, n int) string {
	if len(s) <= n {
		return s
	}
	if n <= 0 {
		return ""
	}
	cut := n
	// Step back over continuation bytes, at most utf8.UTFMax-1 of them: further back there is
	// no character start to find (the bytes are invalid and may be cut anywhere).
	for i := 0; i < utf8.UTFMax-1 && cut > 0 && !utf8.RuneStart(s[cut]); i++ {
		cut--
	}
	if !utf8.RuneStart(s[cut]) {
		return s[:n]
	}
	return s[:cut]
}
