/* json.c — JSON string literals of arbitrary bytes (json.h). */
#include "base/json.h"

#include <stdio.h>
#include <string.h>

size_t mt_utf8_seq(const unsigned char *s, size_t avail) {
  unsigned c = s[0];
  if (c < 0x80)
    return 1;
  size_t len = c >= 0xC2 && c <= 0xDF   ? 2
               : c >= 0xE0 && c <= 0xEF ? 3
               : c >= 0xF0 && c <= 0xF4 ? 4
                                        : 0;
  if (!len || len > avail)
    return 0;
  for (size_t i = 1; i < len; i++)
    if ((s[i] & 0xC0) != 0x80)
      return 0;
  /* overlong three- and four-byte forms, UTF-16 surrogates, past U+10FFFF */
  if ((c == 0xE0 && s[1] < 0xA0) || (c == 0xED && s[1] >= 0xA0) || (c == 0xF0 && s[1] < 0x90) ||
      (c == 0xF4 && s[1] >= 0x90))
    return 0;
  return len;
}

/* The bytes that stand for the character at s (escaped or not) into piece; returns how many
 * input bytes it consumed. */
static size_t encode_one(const unsigned char *s, size_t avail, char piece[8], size_t *plen) {
  unsigned c = s[0];
  if (c == '"' || c == '\\') {
    piece[0] = '\\', piece[1] = (char)c, *plen = 2;
    return 1;
  }
  if (c < 0x20 || c == 0x7f) {
    *plen = (size_t)snprintf(piece, 8, "\\u%04x", c);
    return 1;
  }
  size_t len = mt_utf8_seq(s, avail);
  if (!len) {
    memcpy(piece, "\\ufffd", 6), *plen = 6;
    return 1;
  }
  memcpy(piece, s, len), *plen = len;
  return len;
}

size_t mt_json_string(char *out, size_t size, const char *s) {
  if (size < 3) {
    if (size)
      out[0] = '\0';
    return 0;
  }
  const unsigned char *p = (const unsigned char *)s;
  size_t avail = strlen(s), used = 0;
  out[used++] = '"';
  while (avail) {
    char piece[8];
    size_t plen, took = encode_one(p, avail, piece, &plen);
    if (used + plen + 2 > size) /* room for the closing quote and the NUL */
      break;
    memcpy(out + used, piece, plen);
    used += plen, p += took, avail -= took;
  }
  out[used++] = '"';
  out[used] = '\0';
  return used;
}
