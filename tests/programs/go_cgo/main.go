// A Go program linked with cgo: its runtime ends the process with a raw
// exit_group, past every libc exit path. c_alloc makes a known number of
// C allocations; the Go side allocates and prints; `exit N` ends through
// os.Exit(N), otherwise main returns. `burn` first burns CPU in Go code on
// two goroutines (goBurn, 0.6 s each) while the main thread burns in C
// (c_burn, 0.4 s), and prints the CPU time each measured itself.
package main

/*
#include <stdlib.h>
#include <time.h>
static double thread_cpu(void) {
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}
__attribute__((noinline)) static double c_burn(double secs) {
    double x = 0, start = thread_cpu();
    while (thread_cpu() - start < secs)
        for (int i = 0; i < 100000; i++) x += i * 0.5;
    return x;
}
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
	"sync"
	"time"
)

//go:noinline
func goBurn(d time.Duration) float64 {
	x := 0.0
	end := time.Now().Add(d)
	for time.Now().Before(end) {
		for i := 0; i < 100000; i++ {
			x += float64(i) * 0.5
		}
	}
	return x
}

func burn() {
	var wg sync.WaitGroup
	for g := 0; g < 2; g++ {
		wg.Add(1)
		go func() { defer wg.Done(); goBurn(600 * time.Millisecond) }()
	}
	C.c_burn(0.4)
	wg.Wait()
	fmt.Println("burnt")
}

func main() {
	if len(os.Args) > 1 && os.Args[1] == "burn" {
		burn()
	}
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
