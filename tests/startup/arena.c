/* An arena allocator for CPython (PyObject_SetArenaAllocator) that keeps a few freed blocks for
 * reuse instead of unmapping each at once. CPython 3.11 takes its frames' 16 KiB stack chunks
 * from the arena allocator and returns a chunk as soon as the frame that opened it returns, so a
 * call depth that goes back and forth over a chunk's edge maps and unmaps the same chunk again
 * and again: tens of thousands of mmap/munmap pairs and their page faults in a command, most of
 * them while JAX traces. Built and loaded by tests/startup/arena_allocator.py, for the test processes
 * only.
 *
 * The contract CPython asks of an arena allocator: alloc(ctx, size) returns `size` bytes or NULL
 * (nothing says zeroed), free(ctx, ptr, size) takes back a block alloc gave (or, after a switch
 * of allocator, one the default mmap allocator gave: also unmappable). Called with the GIL held,
 * so one thread at a time. */
#include <stddef.h>
#include <sys/mman.h>

#define KEEP 16 /* blocks kept: at most 16 x 1 MiB (pymalloc's arenas) held back */

static void *kept[KEEP];
static size_t kept_size[KEEP];
static int n_kept;

void *arena_alloc(void *ctx, size_t size) {
    (void)ctx;
    for (int i = n_kept - 1; i >= 0; i--) {
        if (kept_size[i] == size) {
            void *p = kept[i];
            n_kept--;
            kept[i] = kept[n_kept];
            kept_size[i] = kept_size[n_kept];
            return p;
        }
    }
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

void arena_free(void *ctx, void *ptr, size_t size) {
    (void)ctx;
    if (n_kept < KEEP) {
        kept[n_kept] = ptr;
        kept_size[n_kept] = size;
        n_kept++;
        return;
    }
    munmap(ptr, size);
}
