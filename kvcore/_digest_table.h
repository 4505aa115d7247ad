/* The native pool's prefix map: block hashes of one fixed width, in flat arrays.
 *
 * Plain C, no Python: kvcore/_native.c drives it when every block hash of a
 * pool is a bytes object of one width (the digests kvcore's hashers make).
 * Per block it keeps the digest the block carries or last carried and one
 * bit saying whether it carries it now; per (group, digest) the block a
 * lookup finds, in an open-addressing table of 32-bit slots probed linearly.
 *
 * A slot is 0 (empty) or ``tag << (idbits + distbits) | distance << idbits
 * | (block + 1)``: idbits is the bit length of the block count; distance
 * how many slots the entry sits past its home slot (distbits, at most 5,
 * and none before the tag has 8, hold it; all ones: further, found from
 * the digest); the tag the top bits
 * left over, taken from the key's mix, so that most probes of another key
 * are refused without reading its digest. A table entry is found by its
 * block's digest and group (the caller's group bytes), which therefore must
 * not change while the block is an entry. Removal shifts the run after the
 * slot back (no tombstones), reading each later entry's home from its
 * distance, so the table never needs rebuilding: at most one entry a block,
 * in slots for 1.5 times the blocks (at most two thirds full).
 */
#ifndef KVCORE_DIGEST_TABLE_H
#define KVCORE_DIGEST_TABLE_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

typedef void *(*dt_calloc_fn)(size_t count, size_t size);
typedef void (*dt_free_fn)(void *memory);

typedef struct {
    dt_calloc_fn zalloc;     /* the allocator the arrays came from */
    dt_free_fn release;
    size_t width;            /* bytes per digest, 1..64 */
    size_t num_blocks;
    size_t num_groups;       /* 1..256 */
    unsigned char *digests;  /* num_blocks * width */
    unsigned char *carried;  /* one bit a block: it carries its digest now */
    uint32_t *slots;
    size_t cap;
    unsigned idbits;
    unsigned distbits;       /* bits of a slot for its entry's distance from home */
    size_t num_carried;      /* blocks whose bit is set */
    size_t *entries;         /* table entries per group */
    int prefetch;            /* loops over many blocks load ahead (a large table) */
} DigestTable;

/* 0, or -1 when memory runs out (nothing allocated then). The arrays come
 * from ``zalloc`` and go back to ``release`` (the caller's allocator, so that its
 * memory accounting sees them). */
int dt_init(DigestTable *table, size_t num_blocks, size_t width, size_t num_groups,
            dt_calloc_fn zalloc, dt_free_fn release);
void dt_free(DigestTable *table);
/* Bytes the table allocated. */
size_t dt_nbytes(const DigestTable *table);

static inline int
dt_carries(const DigestTable *table, int32_t block)
{
    return (table->carried[block >> 3] >> (block & 7)) & 1;
}

static inline const unsigned char *
dt_digest(const DigestTable *table, int32_t block)
{
    return table->digests + (size_t)block * table->width;
}

/* Copy one digest of the table's width (the common widths with a fixed
 * size, which the compiler inlines instead of calling memcpy). */
static inline void
dt_copy(const DigestTable *table, unsigned char *to, const unsigned char *from)
{
    switch (table->width) {
    case 32:
        memcpy(to, from, 32);
        break;
    case 16:
        memcpy(to, from, 16);
        break;
    case 8:
        memcpy(to, from, 8);
        break;
    default:
        memcpy(to, from, table->width);
    }
}

/* Whether two digests of the table's width are equal (the common widths
 * compared without a call to memcmp). */
static inline int
dt_same(const DigestTable *table, const unsigned char *a, const unsigned char *b)
{
    uint64_t x[4], y[4];
    switch (table->width) {
    case 32:
        memcpy(x, a, 32);
        memcpy(y, b, 32);
        return ((x[0] ^ y[0]) | (x[1] ^ y[1]) | (x[2] ^ y[2]) | (x[3] ^ y[3])) == 0;
    case 16:
        memcpy(x, a, 16);
        memcpy(y, b, 16);
        return ((x[0] ^ y[0]) | (x[1] ^ y[1])) == 0;
    case 8:
        memcpy(x, a, 8);
        memcpy(y, b, 8);
        return x[0] == y[0];
    default:
        return memcmp(a, b, table->width) == 0;
    }
}

/* Give ``block`` the digest ``key`` (NULL: keep the stored one) and set its bit. */
void dt_carry(DigestTable *table, int32_t block, const unsigned char *key);
/* Clear ``block``'s bit (its digest stays stored: a table entry may still use it). */
void dt_drop(DigestTable *table, int32_t block);
/* Store ``key`` as ``block``'s digest without changing its bit. */
void dt_store(DigestTable *table, int32_t block, const unsigned char *key);

/* The entry block for ``key`` in ``group``, or -1. */
int32_t dt_find(const DigestTable *table, const unsigned char *groups, unsigned group,
                const unsigned char *key);
/* Make ``block`` the entry of its stored digest in its group (no entry there yet). */
void dt_insert(DigestTable *table, const unsigned char *groups, int32_t block);
/* dt_insert unless its digest has an entry in its group already: -1 when
 * inserted, else the entry's block (one probe for both). */
int32_t dt_find_or_insert(DigestTable *table, const unsigned char *groups, int32_t block);
/* Remove the entry of ``block``'s stored digest in its group if it names
 * ``block``: 1 when removed, 0 when the entry names another block or there
 * is none. */
int dt_remove_block(DigestTable *table, const unsigned char *groups, int32_t block);
/* A table of at least this many bytes outgrows a core's own cache (L2):
 * then nearly every digest and slot a loop reads is a cache miss, and the
 * loops load a few blocks ahead (``prefetch``). In a smaller table loading
 * ahead costs more than it saves (measured: 6-10 % slower at 12,000 blocks,
 * 6 % faster at 50,000, 1.6 times as fast at 300,000). */
#define DT_PREFETCH_FROM ((size_t)2 << 20)

/* Hints for a loop over many blocks, which start loading what a later step
 * reads (no effect on the table's contents): ``block``'s digest; once it is
 * loaded, the slot where a probe for it starts; the slot where a probe for
 * ``key`` starts; and, once that slot is loaded, the digest of the entry the
 * probe will compare first. */
void dt_prefetch_digest(const DigestTable *table, int32_t block);
void dt_prefetch_home(const DigestTable *table, const unsigned char *groups, int32_t block);
void dt_prefetch_key(const DigestTable *table, unsigned group, const unsigned char *key);
void dt_prefetch_entry(const DigestTable *table, unsigned group, const unsigned char *key);

/* Point the entry of ``key`` in ``group`` at ``block`` (same digest and group); 0, or -1 if none. */
int dt_repoint(DigestTable *table, const unsigned char *groups, unsigned group,
               const unsigned char *key, int32_t block);
/* Remove the entry of ``key`` in ``group``: the block it named, or -1 if there was none. */
int32_t dt_remove(DigestTable *table, const unsigned char *groups, unsigned group,
                  const unsigned char *key);
/* Forget every entry and every bit (digests stay stored). */
void dt_clear(DigestTable *table);
/* The entry block of slot ``index``, or -1 for an empty slot (for walking the table). */
int32_t dt_slot_block(const DigestTable *table, size_t index);

#endif
