package mtpkit.core

/** A ring's first room beyond the window: one verify at the default maxDraft 16 (runtime/backends/window_kv.py). */
const val VERIFY_ROOM = 17

/**
 * The host's KV buffers for window KV I/O (mirrors WindowKV in runtime/backends/window_kv.py).
 *
 * A full-attention layer keeps every position, a sliding-window layer a ring of its window, one verify call and
 * the answer since [keepFrom]: position p at slot p % size. A target call at `pos` writes its new entries at
 * pos..pos+T-1. Rollback after a rejected draft is only a rewind of the caller's `pos`: masks come from absolute
 * positions, so entries beyond it are never read until they are overwritten. A rewind further back than a ring
 * holds is refused by [resumable], and the caller prefills again.
 */
class WindowKv(private val manifest: ModelManifest) {
    val capacity = manifest.capacity
    private val ringSize = minOf(capacity, manifest.drafterSlidingVisible + VERIFY_ROOM)
    private val stores = manifest.kvLayers.associate {
        it.layer to KvStore(it, if (it.type == "full_attention") capacity else ringSize, it.type != "full_attention")
    }
    private var keep = 0

    val layerIndices: List<Int> get() = stores.keys.toList()

    /** The past window a target call at [pos] reads: full layers all of it, sliding layers the last W-1. */
    fun past(layer: Int, pos: Int): Pair<Tensor, Tensor> {
        val store = stores.getValue(layer)
        return store.read(if (store.ring) maxOf(0, pos - manifest.slidingPast) else 0, pos)
    }

    /** Writes a call's T new entries ([1, h, T, d] each) at positions pos..pos+T-1; a ring first grows to keep
     *  every position from [keepFrom]'s window on. */
    fun write(layer: Int, pos: Int, kNew: Tensor, vNew: Tensor) {
        val store = stores.getValue(layer)
        val end = pos + kNew.shape[2].toInt()
        if (store.ring) store.grow(end - maxOf(0, minOf(keep, end) - manifest.drafterSlidingVisible), capacity)
        store.write(pos, kNew, vNew)
    }

    /** Keep positions from [pos] on readable (a generate's answer), with the window before it. */
    fun keepFrom(pos: Int) {
        keep = pos
    }

    /** Whether a call may start at [pos]: every ring still holds what the target and the drafter read before it. */
    fun resumable(pos: Int): Boolean =
        stores.values.all { !it.ring || it.holds(maxOf(0, pos - manifest.drafterSlidingVisible), pos) }

    /** The positions a sliding layer holds now (its ring's size). */
    fun slidingSlots(): Int = stores.values.filter { it.ring }.maxOfOrNull { it.size } ?: 0

    fun checkRoom(pos: Int, count: Int) {
        if (pos + count > capacity) {
            throw IllegalStateException("KV cache full: ${pos + count} positions needed, export capacity is $capacity; " +
                "shorten the prompt or max new tokens, or re-export with a larger --max-cache-len")
        }
    }

    /**
     * The clean hand-off (runtime/handoff.py, mode clean): the drafter sees only committed positions < pos;
     * its full-attention store layer all of them, its sliding one the last W+1.
     */
    fun drafterView(pos: Int): DrafterView = manifest.drafterLayers.mapValues { (type, layer) ->
        val lo = if (type == "full_attention") 0 else maxOf(0, pos - manifest.drafterSlidingVisible)
        stores.getValue(layer).read(lo, pos)
    }
}

/** One layer's K and V for positions [lo, end): position p at slot p % size (a full layer's size is the capacity). */
internal class KvStore(private val d: KvLayer, size: Int, val ring: Boolean) {
    var size = size
        private set
    private var keys = FloatArray(d.kvHeads * size * d.headDim)
    private var values = FloatArray(d.kvHeads * size * d.headDim)
    private var lo = 0
    private var end = 0

    fun holds(from: Int, to: Int): Boolean = lo <= from && to <= end

    /** Positions [from, to) as [1, h, to-from, d] tensors (copies: the buffers keep changing). */
    fun read(from: Int, to: Int): Pair<Tensor, Tensor> {
        val len = to - from
        val shape = longArrayOf(1, d.kvHeads.toLong(), len.toLong(), d.headDim.toLong())
        fun copy(buf: FloatArray): Tensor {
            val out = FloatArray(d.kvHeads * len * d.headDim)
            for (h in 0 until d.kvHeads) runs(from, len) { slot, at, n ->
                val src = (h * size + slot) * d.headDim
                buf.copyInto(out, (h * len + at) * d.headDim, src, src + n * d.headDim)
            }
            return Tensor.of(shape, out)
        }
        return copy(keys) to copy(values)
    }

    /** Entries for positions pos..pos+T-1; of a call longer than the ring only the last [size] are kept. */
    fun write(pos: Int, kNew: Tensor, vNew: Tensor) {
        val count = kNew.shape[2].toInt()
        val kept = minOf(count, size)
        val first = pos + count - kept
        for (h in 0 until d.kvHeads) runs(first, kept) { slot, at, n ->
            val src = (h * count + count - kept + at) * d.headDim
            val dst = (h * size + slot) * d.headDim
            kNew.floats!!.copyInto(keys, dst, src, src + n * d.headDim)
            vNew.floats!!.copyInto(values, dst, src, src + n * d.headDim)
        }
        val held = if (pos <= end) minOf(lo, pos) else pos // after a gap nothing before pos is held
        lo = maxOf(pos + count - size, held)
        end = pos + count
    }

    /** At least [need] slots (at most [cap]), every position held kept; it doubles, so growth is rare. */
    fun grow(need: Int, cap: Int) {
        if (need <= size) return
        val (k, v) = read(lo, end)
        val (from, to) = lo to end
        size = minOf(cap, maxOf(need, 2 * size))
        keys = FloatArray(d.kvHeads * size * d.headDim)
        values = FloatArray(d.kvHeads * size * d.headDim)
        lo = from
        end = from
        write(from, k, v)
        lo = from
        end = to
    }

    /** The at most two runs of slots positions [from, from+len) occupy: (first slot, offset in the range, length). */
    private inline fun runs(from: Int, len: Int, copy: (Int, Int, Int) -> Unit) {
        val first = from % size
        val head = minOf(len, size - first)
        if (head > 0) copy(first, 0, head)
        if (len > head) copy(0, head, len - head)
    }
}
