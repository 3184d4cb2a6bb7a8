// A Go program linked with cgo: its runtime ends the process with a raw
// exit_group, past every libc exit path. c_alloc makes a known number of
// C allocations; the Go side allocates and prints; `exit N` ends through
// os.Exit(N), otherwise main returns.
package main

/*
#include <stdlib.h>
__attribute__((noinline)) static void c_alloc(int n) {
    for (int i = 0; i < n; i++) {
        void *volatile p = malloc(100);
        free(p);
    }
}
*/
import "C"

import (
	"fmt"
	"os"
	"strconv"
)

func main() {
	C.c_alloc(5000)
	words := make([]string, 0)
	for i := 0; i < 1000; i++ {
		words = append(words, strconv.Itoa(i))
	}
	fmt.Println("go done", len(words))
	if len(os.Args) > 2 && os.Args[1] == "exit" {
		n, _ := strconv.Atoi(os.Args[2])
		os.Exit(n)
	}
}
