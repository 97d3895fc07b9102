// libjpeg (the one Caffe's OpenCV 4.6 links) on files as OpenCV's imread reads them
// (jpeg_stdio_src), for checking formats/jpeg_scans.py's walk (checking only; never built by
// the tests). gcc -O1 -o libjpeg_probe libjpeg_probe.c -ljpeg
// probe FILE... -> per file one line: PATH ok|error HIT EOF COMPLETE OTHER, where HIT is 1 when
// libjpeg hit the end of the data or a marker inside a scan (JWRN_HIT_MARKER: it made up
// zeros), EOF 1 when it inserted an EOI (JWRN_JPEG_EOF), COMPLETE 1 when every coefficient
// of a progressive file has its last bit (-1: not progressive), OTHER the other warnings.
// Whole but for its EOI: ok, HIT 0, EOF 1, COMPLETE not 0.
#include <stdio.h>
#include <setjmp.h>
#include <stdlib.h>
#include <string.h>
#include <jpeglib.h>
#include <jerror.h>
struct err { struct jpeg_error_mgr pub; jmp_buf jump; int hit, eof, other; };
static void on_error(j_common_ptr c) { longjmp(((struct err *)c->err)->jump, 1); }
static void on_message(j_common_ptr c, int level) {
  struct err *e = (struct err *)c->err;
  if (level >= 0) return;
  if (c->err->msg_code == JWRN_HIT_MARKER) e->hit = 1;
  else if (c->err->msg_code == JWRN_JPEG_EOF) e->eof = 1;
  else e->other++;
}
int main(int argc, char **argv) {
  for (int i = 1; i < argc; i++) {
    FILE *f = fopen(argv[i], "rb");
    struct jpeg_decompress_struct d; struct err e;
    memset(&e, 0, sizeof e);
    d.err = jpeg_std_error(&e.pub); e.pub.error_exit = on_error; e.pub.emit_message = on_message;
    JSAMPLE *row = NULL; int complete = -1;
    if (setjmp(e.jump)) {
      printf("%s error %d %d %d %d\n", argv[i], e.hit, e.eof, complete, e.other);
      jpeg_destroy_decompress(&d); fclose(f); free(row); continue;
    }
    jpeg_create_decompress(&d);
    jpeg_stdio_src(&d, f);
    jpeg_read_header(&d, TRUE);
    d.out_color_space = d.jpeg_color_space == JCS_GRAYSCALE ? JCS_GRAYSCALE : d.out_color_space;
    jpeg_start_decompress(&d);
    row = malloc((size_t)d.output_width * d.output_components);
    while (d.output_scanline < d.output_height) jpeg_read_scanlines(&d, &row, 1);
    if (d.progressive_mode) {
      complete = 1;
      for (int c = 0; c < d.num_components; c++)
        for (int k = 0; k < 64; k++) if (d.coef_bits[c][k] != 0) complete = 0;
    }
    jpeg_finish_decompress(&d);
    printf("%s ok %d %d %d %d\n", argv[i], e.hit, e.eof, complete, e.other);
    jpeg_destroy_decompress(&d); fclose(f); free(row);
  }
  return 0;
}
