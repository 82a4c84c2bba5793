// A node (V8) heap of distinct records in a Map, checked twice.
//
// usage: node mapcheck.js ENTRIES
//
// Prints "ok ENTRIES SUM" and exits 0 only if every record reads back as
// made (a page of the heap read back wrong fails a record).
const n = parseInt(process.argv[2]);
function record(k) {
  let x = BigInt.asUintN(64, BigInt(k) * 0x9E3779B97F4A7C15n + 1n);
  let s = "";
  for (let i = 0; i < 4; i++) {
    x ^= BigInt.asUintN(64, x << 13n); x ^= x >> 7n; x ^= BigInt.asUintN(64, x << 17n);
    s += x.toString(16);
  }
  return s;
}
const m = new Map();
for (let k = 0; k < n; k++) m.set(k, { key: k, text: record(k) });
let sum = 0;
for (let pass = 0; pass < 2; pass++) {
  let k = 0;
  for (let i = 0; i < n; i++) {
    k = (k + 7919) % n;
    const got = m.get(k);
    if (!got || got.key !== k || got.text !== record(k)) { console.log("record " + k + " is wrong"); process.exit(1); }
    sum += got.text.length;
  }
}
console.log("ok " + n + " " + sum);
