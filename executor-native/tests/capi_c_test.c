/* capi_c_test: the C API is plain C. A C99 program includes fusedcomm.h, links the library's C
 * API and reads a status, its name and the last error message. */
#include <stdio.h>
#include <string.h>

#include "fusedcomm/fusedcomm.h"

int main(void) {
  int version = 0;
  const fc_op_desc_t desc = {"capi_c_test", 1};
  float x = 1.0f;
  fc_status_t s = fc_all_reduce(NULL, &desc, FC_DTYPE_F32, &x, &x, 1, NULL);
  if (s != FC_STATUS_STATE || strstr(fc_last_error_message(), "closed") == NULL) {
    fprintf(stderr, "FAIL: a null communicator: %s: %s\n", fc_status_string(s), fc_last_error_message());
    return 1;
  }
  if (fc_get_version(&version) != FC_STATUS_SUCCESS || version != FUSEDCOMM_API_VERSION) {
    fprintf(stderr, "FAIL: fc_get_version\n");
    return 1;
  }
  printf("capi_c_test: passed (%s)\n", fc_status_string(s));
  return 0;
}
