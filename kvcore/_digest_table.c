/* The native pool's prefix map over fixed-width digests: see _digest_table.h. */
#include "_digest_table.h"

#include <string.h>

static inline uint64_t
load64(const unsigned char *bytes, size_t width)
{
    uint64_t word = 0;
    if (width >= 8) {
        memcpy(&word, bytes, 8); /* a fixed size: inlined, not a call */
    }
    else {
        memcpy(&word, bytes, width);
    }
    return word;
}

/* A well-spread 64-bit mix of (group, key); digests are near-random, but a
 * key given by hand need not be, hence the finaliser (splitmix64's). */
static inline uint64_t
mix(const DigestTable *table, unsigned group, const unsigned char *key)
{
    uint64_t h = load64(key, table->width);
    if (table->width > 8) {
        uint64_t tail = load64(key + table->width - 8, 8);
        h ^= (tail << 32) | (tail >> 32);
    }
    h ^= ((uint64_t)group + 1) * 0x9E3779B97F4A7C15ULL;
    h ^= h >> 30;
    h *= 0xBF58476D1CE4E5B9ULL;
    h ^= h >> 27;
    h *= 0x94D049BB133111EBULL;
    h ^= h >> 31;
    return h;
}

/* The first slot to probe: the mix's high bits scaled to the capacity. */
static inline size_t
home_of(const DigestTable *table, uint64_t h)
{
    return (size_t)(((unsigned __int128)h * table->cap) >> 64);
}

/* The most bits a slot spends on its entry's distance from its home slot,
 * and the fewest it keeps for the tag before it spends any on the distance
 * (a tag of fewer bits lets more probes of other keys read a digest). */
#define DIST_BITS 5
#define MIN_TAG_BITS 8

/* A distance too large for the slot's bits: the entry's home is then found
 * from its digest. */
static inline uint32_t
far_away(const DigestTable *table)
{
    return (1u << table->distbits) - 1;
}

static inline uint32_t
tag_of(const DigestTable *table, uint64_t h)
{
    unsigned shift = table->idbits + table->distbits;
    return shift >= 32 ? 0 : (uint32_t)h >> shift;
}

static inline uint32_t
tag_in(const DigestTable *table, uint32_t value)
{
    unsigned shift = table->idbits + table->distbits;
    return shift >= 32 ? 0 : value >> shift;
}

static inline size_t
next_slot(const DigestTable *table, size_t index)
{
    return index + 1 == table->cap ? 0 : index + 1;
}

/* How many slots ``index`` lies past ``home``, cyclically. */
static inline size_t
distance(const DigestTable *table, size_t home, size_t index)
{
    return index >= home ? index - home : index + table->cap - home;
}

/* The same entry at another distance from its home (capped at far_away). */
static inline uint32_t
with_distance(const DigestTable *table, uint32_t value, size_t dist)
{
    uint32_t far = far_away(table);
    uint32_t stored = dist < far ? (uint32_t)dist : far;
    return (value & ~(far << table->idbits)) | (stored << table->idbits);
}

/* A slot's value: the tag of ``h``, the distance, the block. */
static inline uint32_t
slot_value(const DigestTable *table, uint64_t h, size_t dist, int32_t block)
{
    unsigned shift = table->idbits + table->distbits;
    uint32_t tagged = shift >= 32 ? 0 : tag_of(table, h) << shift;
    return with_distance(table, tagged | (uint32_t)(block + 1), dist);
}

static inline uint32_t
distance_in(const DigestTable *table, uint32_t value)
{
    return (value >> table->idbits) & far_away(table);
}

static inline int32_t
block_in(const DigestTable *table, uint32_t value)
{
    return (int32_t)(value & ((1u << table->idbits) - 1)) - 1;
}

int
dt_init(DigestTable *table, size_t num_blocks, size_t width, size_t num_groups,
        dt_calloc_fn zalloc, dt_free_fn release)
{
    memset(table, 0, sizeof *table);
    table->zalloc = zalloc;
    table->release = release;
    table->width = width;
    table->num_blocks = num_blocks;
    table->num_groups = num_groups;
    table->cap = num_blocks + num_blocks / 2 + 16;
    unsigned bits = 1;
    while (bits < 31 && ((size_t)1 << bits) <= num_blocks) {
        bits++;
    }
    table->idbits = bits;
    unsigned spare = bits + MIN_TAG_BITS < 32 ? 32 - MIN_TAG_BITS - bits : 0;
    table->distbits = spare < DIST_BITS ? spare : DIST_BITS;
    table->digests = zalloc(num_blocks, width);
    table->carried = zalloc((num_blocks + 7) / 8, 1);
    table->slots = zalloc(table->cap, sizeof(uint32_t));
    table->entries = zalloc(num_groups, sizeof(size_t));
    if (!table->digests || !table->carried || !table->slots || !table->entries) {
        dt_free(table);
        return -1;
    }
    table->prefetch = dt_nbytes(table) >= DT_PREFETCH_FROM;
    return 0;
}

void
dt_free(DigestTable *table)
{
    table->release(table->digests);
    table->release(table->carried);
    table->release(table->slots);
    table->release(table->entries);
    table->digests = table->carried = NULL;
    table->slots = NULL;
    table->entries = NULL;
}

size_t
dt_nbytes(const DigestTable *table)
{
    return table->num_blocks * table->width + (table->num_blocks + 7) / 8 +
           table->cap * sizeof(uint32_t) + table->num_groups * sizeof(size_t);
}

void
dt_carry(DigestTable *table, int32_t block, const unsigned char *key)
{
    if (key != NULL) {
        dt_store(table, block, key);
    }
    if (!dt_carries(table, block)) {
        table->carried[block >> 3] |= (unsigned char)(1u << (block & 7));
        table->num_carried++;
    }
}

void
dt_drop(DigestTable *table, int32_t block)
{
    if (dt_carries(table, block)) {
        table->carried[block >> 3] &= (unsigned char)~(1u << (block & 7));
        table->num_carried--;
    }
}

void
dt_store(DigestTable *table, int32_t block, const unsigned char *key)
{
    dt_copy(table, table->digests + (size_t)block * table->width, key);
}

/* The slot holding the entry of (group, key), or cap when there is none. */
static size_t
find_slot(const DigestTable *table, const unsigned char *groups, unsigned group,
          const unsigned char *key, uint64_t h)
{
    uint32_t tag = tag_of(table, h);
    for (size_t index = home_of(table, h);; index = next_slot(table, index)) {
        uint32_t value = table->slots[index];
        if (value == 0) {
            return table->cap;
        }
        if (tag_in(table, value) != tag) {
            continue;
        }
        int32_t block = block_in(table, value);
        if (groups[block] == group && dt_same(table, dt_digest(table, block), key)) {
            return index;
        }
    }
}

int32_t
dt_find(const DigestTable *table, const unsigned char *groups, unsigned group,
        const unsigned char *key)
{
    size_t index = find_slot(table, groups, group, key, mix(table, group, key));
    return index == table->cap ? -1 : block_in(table, table->slots[index]);
}

void
dt_insert(DigestTable *table, const unsigned char *groups, int32_t block)
{
    unsigned group = groups[block];
    uint64_t h = mix(table, group, dt_digest(table, block));
    size_t home = home_of(table, h);
    size_t index = home;
    while (table->slots[index] != 0) {
        index = next_slot(table, index);
    }
    table->slots[index] = slot_value(table, h, distance(table, home, index), block);
    table->entries[group]++;
}

int32_t
dt_find_or_insert(DigestTable *table, const unsigned char *groups, int32_t block)
{
    unsigned group = groups[block];
    const unsigned char *key = dt_digest(table, block);
    uint64_t h = mix(table, group, key);
    uint32_t tag = tag_of(table, h);
    size_t home = home_of(table, h);
    size_t index = home;
    for (uint32_t value; (value = table->slots[index]) != 0; index = next_slot(table, index)) {
        if (tag_in(table, value) != tag) {
            continue;
        }
        int32_t other = block_in(table, value);
        if (groups[other] == group && dt_same(table, dt_digest(table, other), key)) {
            return other;
        }
    }
    table->slots[index] = slot_value(table, h, distance(table, home, index), block);
    table->entries[group]++;
    return -1;
}

int
dt_repoint(DigestTable *table, const unsigned char *groups, unsigned group,
           const unsigned char *key, int32_t block)
{
    uint64_t h = mix(table, group, key);
    size_t index = find_slot(table, groups, group, key, h);
    if (index == table->cap) {
        return -1;
    }
    uint32_t old = table->slots[index];
    table->slots[index] = (old & ~((1u << table->idbits) - 1)) | (uint32_t)(block + 1);
    return 0;
}

/* Whether ``home`` lies cyclically in (hole, index]: the entry at index may not move to hole. */
static inline int
stays(size_t hole, size_t index, size_t home)
{
    return hole <= index ? (hole < home && home <= index) : (hole < home || home <= index);
}

void
dt_prefetch_digest(const DigestTable *table, int32_t block)
{
    __builtin_prefetch(dt_digest(table, block));
}

void
dt_prefetch_home(const DigestTable *table, const unsigned char *groups, int32_t block)
{
    dt_prefetch_key(table, groups[block], dt_digest(table, block));
}

void
dt_prefetch_key(const DigestTable *table, unsigned group, const unsigned char *key)
{
    __builtin_prefetch(&table->slots[home_of(table, mix(table, group, key))]);
}

void
dt_prefetch_entry(const DigestTable *table, unsigned group, const unsigned char *key)
{
    uint64_t h = mix(table, group, key);
    uint32_t tag = tag_of(table, h);
    size_t index = home_of(table, h);
    for (int probes = 0; probes < 4; probes++, index = next_slot(table, index)) {
        uint32_t value = table->slots[index];
        if (value == 0) {
            return;
        }
        if (tag_in(table, value) == tag) {
            __builtin_prefetch(dt_digest(table, block_in(table, value)));
            return;
        }
    }
}

/* The home slot of the entry at ``index``: from its distance, or, when that
 * was too far to keep, from its digest. */
static inline size_t
home_at(const DigestTable *table, const unsigned char *groups, size_t index)
{
    uint32_t value = table->slots[index];
    uint32_t dist = distance_in(table, value);
    if (dist != far_away(table)) {
        return index >= dist ? index - dist : index + table->cap - dist;
    }
    int32_t block = block_in(table, value);
    return home_of(table, mix(table, groups[block], dt_digest(table, block)));
}

/* Empty slot ``hole`` (an entry of ``group``) and close the gap. */
static void
remove_at(DigestTable *table, const unsigned char *groups, unsigned group, size_t hole)
{
    table->slots[hole] = 0;
    table->entries[group]--;
    /* Shift back every later entry of the run that may sit in the hole. */
    for (size_t index = next_slot(table, hole); table->slots[index] != 0;
         index = next_slot(table, index)) {
        size_t home = home_at(table, groups, index);
        if (!stays(hole, index, home)) {
            table->slots[hole] = with_distance(table, table->slots[index],
                                               distance(table, home, hole));
            table->slots[index] = 0;
            hole = index;
        }
    }
}

int32_t
dt_remove(DigestTable *table, const unsigned char *groups, unsigned group,
          const unsigned char *key)
{
    size_t hole = find_slot(table, groups, group, key, mix(table, group, key));
    if (hole == table->cap) {
        return -1;
    }
    int32_t removed = block_in(table, table->slots[hole]);
    remove_at(table, groups, group, hole);
    return removed;
}

int
dt_remove_block(DigestTable *table, const unsigned char *groups, int32_t block)
{
    unsigned group = groups[block];
    uint64_t h = mix(table, group, dt_digest(table, block));
    /* The block's entry, if it is one, lies in the run from its key's home:
     * found by its id, so no digest is compared. Another block's entry for
     * the same key (one with copies) is left alone. */
    for (size_t index = home_of(table, h);; index = next_slot(table, index)) {
        uint32_t value = table->slots[index];
        if (value == 0) {
            return 0;
        }
        if (block_in(table, value) == block) {
            remove_at(table, groups, group, index);
            return 1;
        }
    }
}

void
dt_clear(DigestTable *table)
{
    memset(table->slots, 0, table->cap * sizeof(uint32_t));
    memset(table->carried, 0, (table->num_blocks + 7) / 8);
    memset(table->entries, 0, table->num_groups * sizeof(size_t));
    table->num_carried = 0;
}

int32_t
dt_slot_block(const DigestTable *table, size_t index)
{
    uint32_t value = table->slots[index];
    return value == 0 ? -1 : block_in(table, value);
}
