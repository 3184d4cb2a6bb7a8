/* Loaded by mem_lifecycle: its constructor allocates inside dlopen. */
#include <stdlib.h>
void *plugin_keep[3];
__attribute__((noinline)) void plugin_init_site(void) { for (int i = 0; i < 3; i++) plugin_keep[i] = malloc(555); }
__attribute__((constructor)) static void plugin_ctor(void) { plugin_init_site(); }
