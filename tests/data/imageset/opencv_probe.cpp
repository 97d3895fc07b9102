// OpenCV itself, for make_corpus.py's resize cases (checking only; never built by the tests).
// g++ -O1 -o opencv_probe opencv_probe.cpp $(pkg-config --cflags --libs opencv4)
// probe: imread(file, flag) [resize w h] -> raw bytes on stdout (rows, cols, channels header line)
// probe enc EXT file flag [w h] -> imencode bytes
#include <opencv2/opencv.hpp>
#include <cstdio>
#include <cstring>
int main(int argc, char** argv) {
  bool enc = argc > 1 && strcmp(argv[1], "enc") == 0;
  int a = enc ? 3 : 1;
  std::string ext = enc ? argv[2] : "";
  int flag = atoi(argv[a + 1]);
  cv::Mat img = cv::imread(argv[a], flag);
  if (!img.data) { fprintf(stderr, "fail\n"); return 3; }
  if (argc > a + 3) {
    cv::Mat out; cv::resize(img, out, cv::Size(atoi(argv[a + 2]), atoi(argv[a + 3]))); img = out;
  }
  if (enc) {
    std::vector<uchar> buf; cv::imencode(ext, img, buf);
    fwrite(buf.data(), 1, buf.size(), stdout); return 0;
  }
  printf("%d %d %d %d\n", img.rows, img.cols, img.channels(), (int)img.depth());
  for (int r = 0; r < img.rows; r++) fwrite(img.ptr(r), 1, img.cols * img.elemSize(), stdout);
  return 0;
}
