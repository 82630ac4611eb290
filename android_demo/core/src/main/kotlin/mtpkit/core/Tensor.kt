package mtpkit.core

/**
 * A dense row-major tensor as it crosses the graph boundary: float data for activations, K/V and logits,
 * long data for token ids and positions (the exported graphs take int64). Exactly one of the arrays is set.
 */
class Tensor private constructor(val shape: LongArray, val floats: FloatArray?, val longs: LongArray?) {
    init {
        val size = shape.fold(1L) { a, b -> a * b }
        require(size == (floats?.size ?: longs!!.size).toLong()) { "shape ${shape.toList()} does not match data size" }
    }

    companion object {
        fun of(shape: LongArray, data: FloatArray) = Tensor(shape, data, null)
        fun ofLongs(shape: LongArray, data: LongArray) = Tensor(shape, null, data)
    }

    /** Row [i] of a [1, T, X] tensor (logits or activations), copied. */
    fun row(i: Int): FloatArray {
        val width = shape.last().toInt()
        return floats!!.copyOfRange(i * width, (i + 1) * width)
    }
}

/** Logits [T, V] and activations [T, H] of one target call, one row per input token. */
class TargetOutput(val logits: List<FloatArray>, val activations: List<FloatArray>)

/** One drafter step: logits [V] and the activations for the next step [H]. */
class DraftOutput(val logits: FloatArray, val activations: FloatArray)

/** Store-layer K/V per layer type, as the drafter may read them (empty for fakes that ignore it). */
typealias DrafterView = Map<String, Pair<Tensor, Tensor>>

/** The target as the loop sees it; mirrors the Target Protocol in runtime/backends/__init__.py. */
interface Target {
    val calls: Int // graph calls so far, prefill included

    /** Runs [ids] at positions pos..pos+ids.size-1, writes their K/V, returns one logits/activations row per id. */
    fun forward(ids: IntArray, pos: Int): TargetOutput

    /** What the drafter may read when drafting for the newest token at [pos] (clean hand-off: positions < pos). */
    fun drafterView(pos: Int): DrafterView

    /** Keep positions from [pos] on readable (the answer a generate adds); a cache that keeps every position need
     *  not do anything. */
    fun keepFrom(pos: Int) {}

    /** Whether a call may start at [pos] on what the cache holds (a sliding-window ring forgets old positions). */
    fun resumable(pos: Int): Boolean = true
}

/** The drafter as the loop sees it; it has no cache of its own, so there is nothing to roll back. */
interface Drafter {
    val calls: Int

    /** One draft step at a constant [pos], fed the newest token and the previous step's activations. */
    fun step(token: Int, activations: FloatArray, pos: Int, view: DrafterView): DraftOutput
}

/**
 * Runs one graph by tensor name; the only thing a platform adapter implements (JNA on the desktop JVM,
 * ai.onnxruntime on Android). Role binding, KV buffers and the loop stay in core.
 */
interface GraphSession {
    /** Runs [graph] (a key of manifest backends.onnx.graphs); returns [outputs] in order. */
    fun run(graph: String, inputs: Map<String, Tensor>, outputs: List<String>): List<Tensor>
}
