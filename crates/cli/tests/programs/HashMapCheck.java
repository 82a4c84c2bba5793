// A Java heap of distinct records, checked twice.
//
// usage: java HashMapCheck ENTRIES
//
// Builds a HashMap of ENTRIES keys, each to a 64-byte record derived from
// its key, then reads every key back in a scattered order and checks each
// record, twice. Prints "ok ENTRIES SUM" and exits 0 only if every record
// checks out (a page of the heap read back wrong fails a record).
import java.util.HashMap;

public class HashMapCheck {
    static byte[] record(long k) {
        byte[] r = new byte[64];
        long x = k * 0x9E3779B97F4A7C15L + 1;
        for (int i = 0; i < r.length; i++) {
            x ^= x << 13;
            x ^= x >>> 7;
            x ^= x << 17;
            r[i] = (byte) x;
        }
        return r;
    }

    public static void main(String[] args) {
        int n = Integer.parseInt(args[0]);
        HashMap<Long, byte[]> map = new HashMap<>();
        for (long k = 0; k < n; k++) {
            map.put(k, record(k));
        }
        long sum = 0;
        for (int pass = 0; pass < 2; pass++) {
            long k = 0;
            for (int i = 0; i < n; i++) {
                k = (k + 7919) % n;
                byte[] got = map.get(k);
                byte[] want = record(k);
                if (got == null || !java.util.Arrays.equals(got, want)) {
                    System.out.println("record " + k + " is wrong");
                    System.exit(1);
                }
                sum += got[(int) (k % 64)];
            }
        }
        System.out.println("ok " + n + " " + sum);
    }
}
