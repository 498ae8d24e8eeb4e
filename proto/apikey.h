/* Client API keys: their text form and how a keys file stores them. Shared
 * by the gateway (gateway/keys.c checks a presented key) and the tool that
 * makes keys (tools/spillway-apikey.c), so both agree on one format.
 *
 * A key is "sk-sw-<id>-<secret>":
 *   id      1..32 of [0-9a-z]: names the keys-file entry, so a check hashes
 *           once instead of against every entry. It is not secret (it is
 *           in the keys file), but logs and metrics still use the label.
 *   secret  16..128 of base64url (A-Z a-z 0-9 - _); made from 32 random
 *           bytes (libsodium's randombytes_buf), so 43 characters.
 *
 * What a keys file stores instead of the key (never the key itself):
 *   "blake2b$<salt>$<digest>"   both base64url without padding, where salt
 *   is 16 random bytes and digest = BLAKE2b-256 keyed with the salt
 *   (crypto_generichash) over the whole key text, id included, so an entry's
 *   hash cannot be moved to another id.
 *
 * Why a keyed fast hash and not a password hash (argon2id): the secret has
 * 256 random bits, so no guessing attack exists for a slow hash to slow
 * down; a password hash would only cost every request tens of milliseconds
 * of CPU (an easy way to overload the gateway with bad keys) or force a
 * cache of verified keys in memory. The per-key salt keeps two entries with
 * the same key from looking alike and defeats precomputed tables. Digests
 * are compared with sodium_memcmp (constant time).
 *
 * Layer: proto/ (below the gateway and tools); uses libsodium only.
 * Thread-safe: every function may run on any thread.
 */
#ifndef SW_PROTO_APIKEY_H
#define SW_PROTO_APIKEY_H

#include <stdbool.h>
#include <stddef.h>

#define SW_APIKEY_PREFIX "sk-sw-"
#define SW_APIKEY_ID_MAX 32
#define SW_APIKEY_SECRET_MIN 16
#define SW_APIKEY_SECRET_MAX 128
/* Longest key text sw_apikey_split accepts, and room for a generated one. */
#define SW_APIKEY_MAX (sizeof SW_APIKEY_PREFIX - 1 + SW_APIKEY_ID_MAX + 1 + SW_APIKEY_SECRET_MAX)
/* Room for the stored form ("blake2b$" 22 "$" 43, and the NUL). */
#define SW_APIKEY_HASH_MAX 80

/* The id part of key text `key` (NUL-terminated) into id[SW_APIKEY_ID_MAX+1].
 * Returns true when key has the form above; false (id set to "") for
 * anything else, which a gateway answers as a bad key. */
bool sw_apikey_split(const char *key, char id[SW_APIKEY_ID_MAX + 1]);

/* True when id is a valid key id (1..32 of [0-9a-z]). */
bool sw_apikey_id_ok(const char *id);

/* A new random key: its text into key[SW_APIKEY_MAX+1] and its id into
 * id[SW_APIKEY_ID_MAX+1] (12 hex digits). Returns 0, or -1 when libsodium
 * cannot start (no entropy source). */
int sw_apikey_generate(char key[SW_APIKEY_MAX + 1], char id[SW_APIKEY_ID_MAX + 1]);

/* The stored form of `key` with a fresh random salt, into
 * out[SW_APIKEY_HASH_MAX]. Returns 0, or -1 when key is not a valid key or
 * libsodium cannot start. */
int sw_apikey_hash(const char *key, char out[SW_APIKEY_HASH_MAX]);

/* True when `stored` is well formed ("blake2b$" salt "$" digest, each of
 * the right length). A keys-file parser checks this at load time, so a
 * malformed entry is an error there and not a silent never-match. */
bool sw_apikey_hash_ok(const char *stored);

/* True when `key` is the key `stored` was made from (constant-time compare
 * of the digests). False for a malformed key or stored form. */
bool sw_apikey_verify(const char *stored, const char *key);

#endif
