/* index_check: what tensortune_bundle.h reads from a bundle, without a GPU (CI compares it with
 * the manifest and with the Rust crate's lookup).
 *
 *   cc -std=c11 -O1 -I bundle/c -I $CUDA_INCLUDE bundle/c/index_check.c -lm -o index_check
 *   index_check DIR                     -> one line per entry: its launch facts and vendor kind
 *   index_check DIR M N K LAYOUT IN ACC OUT ALPHA BETA ARCH SMS
 *                                       -> "NAME exact|nearest", or "none"
 * Only the parsing and lookup functions are called, so no driver library is linked. */
#include "tensortune_bundle.h"

int main(int argc, char **argv) {
  tt_bundle b;
  if (argc < 2 || tt_bundle_open(&b, argv[1]) != 0) {
    fprintf(stderr, "error: %s\n", argc < 2 ? "usage: index_check DIR [M N K LAYOUT IN ACC OUT ALPHA BETA ARCH SMS]" : b.error);
    return 2;
  }
  if (argc == 2) {
    for (int i = 0; i < b.n; i++) {
      const tt_entry *e = &b.entries[i];
      printf("%s %s %s %u,%u,%u %u,%u,%u %u %u,%u,%u %llu %s", e->name, e->entry, e->op, e->grid[0], e->grid[1],
             e->grid[2], e->block[0], e->block[1], e->block[2], e->smem, e->cluster[0], e->cluster[1], e->cluster[2],
             (unsigned long long)e->workspace, tt_entry_cubin(e, e->arch) ? tt_entry_cubin(e, e->arch) : "-");
      for (int p = 0; p < e->nparams; p++) {
        const tt_param *q = &e->params[p];
        if (q->is_map == 2)
          printf(" im2col:%s:%s:%llu,%llu,%llu,%llu:%llu,%llu,%llu:%d,%d:%d,%d:%u,%u:%u,%u,%u,%u", q->operand, q->dtype,
                 (unsigned long long)q->dims[0], (unsigned long long)q->dims[1], (unsigned long long)q->dims[2],
                 (unsigned long long)q->dims[3], (unsigned long long)q->im2col_strides[0],
                 (unsigned long long)q->im2col_strides[1], (unsigned long long)q->im2col_strides[2], q->lower[0],
                 q->lower[1], q->upper[0], q->upper[1], q->channels, q->pixels, q->elem_strides[0], q->elem_strides[1],
                 q->elem_strides[2], q->elem_strides[3]);
        else if (q->is_map)
          printf(" map:%s:%s:%llu,%llu:%llu:%u,%u", q->operand, q->dtype, (unsigned long long)q->dims[0],
                 (unsigned long long)q->dims[1], (unsigned long long)q->stride_bytes, q->box[0], q->box[1]);
        else
          printf(" ptr:%s", q->operand);
      }
      printf(" vendor:%s\n", e->vendor_kind);
    }
  } else if (argc == 13) {
    tt_matmul q = {strtoull(argv[2], 0, 10), strtoull(argv[3], 0, 10), strtoull(argv[4], 0, 10), argv[5], argv[6],
                   argv[7], argv[8], atof(argv[9]), atof(argv[10])};
    int nearest = 0, i = tt_bundle_find_matmul(&b, &q, atoi(argv[11]), atoi(argv[12]), &nearest);
    if (i < 0) printf("none\n");
    else printf("%s %s\n", b.entries[i].name, nearest ? "nearest" : "exact");
  } else {
    fprintf(stderr, "error: expected DIR alone or DIR and 11 query values\n");
    return 2;
  }
  tt_bundle_close(&b);
  return 0;
}
