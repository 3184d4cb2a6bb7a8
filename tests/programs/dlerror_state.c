/* What dlerror() says at the start of main, after a dlopen and a dlsym
   that succeed (zlib's zlibVersion), and after a dlsym that fails: a
   profiler's own failed lookups must not show in the program's. */
#include <dlfcn.h>
#include <stdio.h>

static void say(const char *when) {
    const char *e = dlerror();
    printf("%s: %s\n", when, e ? e : "(none)");
}

int main(void) {
    say("at start");
    void *z = dlopen("libz.so.1", RTLD_NOW);
    say(z ? "after dlopen" : "dlopen failed");
    if (z && dlsym(z, "zlibVersion"))
        say("after dlsym");
    if (z && !dlsym(z, "no_such_function_here"))
        printf("a failed dlsym reports: %s\n", dlerror() ? "an error" : "(none)");
    say("after dlerror");
    return 0;
}
