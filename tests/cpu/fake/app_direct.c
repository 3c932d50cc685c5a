/* app_direct.c — the fake app linked directly against the fake cuBLAS (a C program linked to
 * cuBLAS). Usage: app_direct OUT EXPECT. Exit 0 when every argument arrived unchanged. */
int fake_app_run(const char *out_path, const char *expect_path);

int main(int argc, char **argv) {
  if (argc != 3)
    return 2;
  return fake_app_run(argv[1], argv[2]) ? 1 : 0;
}
