/* json.h — JSON string literals for the statistics records: always valid JSON, always valid UTF-8.
 *
 * Valid UTF-8 passes through unchanged (so MINITE_ROLE=café reads back as café); '"', '\\' and
 * control characters are escaped; a byte that does not start a valid UTF-8 sequence (a Latin-1
 * byte, a stray continuation byte, an overlong form, a surrogate, a code point past U+10FFFF)
 * becomes U+FFFD, written as the escape \ufffd. Depends on libc alone.
 */
#ifndef MT_JSON_H
#define MT_JSON_H

#include <stddef.h>

/* The length of the valid UTF-8 sequence at s (at most `avail` bytes), or 0 when s[0] does not
 * start one. */
size_t mt_utf8_seq(const unsigned char *s, size_t avail);

/* Write s as a JSON string literal, quotes included, into out (size >= 3). A value that does not
 * fit is cut at a character boundary and the literal still closed. Returns the length written. */
size_t mt_json_string(char *out, size_t size, const char *s);

#endif
