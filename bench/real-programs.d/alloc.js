// Allocation-heavy JavaScript for bench/real-programs: usage node alloc.js N.
// Two worker_threads each build maps of objects and strings, round-trip
// JSON and allocate Buffers (their memory comes from malloc/calloc, the JS
// heap itself from mmap); the main thread sums their checksums.
const { Worker, isMainThread, parentPort, workerData } = require('worker_threads');

function work(n, seed) {
  let m = new Map(), total = 0;
  for (let i = 0; i < n; i++) {
    const k = 'k' + ((i * 7919 + seed) % 20000);
    m.set(k, { i, s: k.repeat(i % 8 + 1), a: [i, i + 1, i + 2] });
    total += Buffer.alloc(64 + (i % 256)).length;
    if (i % 2000 === 1999) {
      const j = JSON.stringify([...m.values()].slice(0, 300));
      total += JSON.parse(j).length + Buffer.from(j).length;
    }
  }
  return total + m.size;
}

if (isMainThread) {
  const n = Number(process.argv[2]);
  let done = 0, sum = 0;
  for (let w = 0; w < 2; w++) {
    const t = new Worker(__filename, { workerData: { n, seed: w } });
    t.on('message', (v) => { sum += v; if (++done === 2) console.log(n, sum); });
    t.on('error', (e) => { console.error(e); process.exitCode = 1; });
  }
} else {
  parentPort.postMessage(work(workerData.n, workerData.seed));
}
