package mtpkit.desktop

import com.sun.jna.Memory
import com.sun.jna.Native
import com.sun.jna.NativeLibrary
import com.sun.jna.Pointer
import com.sun.jna.ptr.LongByReference
import com.sun.jna.ptr.PointerByReference
import java.lang.ref.Reference
import com.sun.jna.Function as JnaFunction

/**
 * ONNX Runtime's C API through JNA, for the desktop JVM only: there is no ORT jar on our machines, but the
 * libonnxruntime.so inside PyPI's onnxruntime wheel exports OrtGetApiBase. Functions are looked up by their
 * slot in the OrtApi table (onnxruntime_c_api.h); ORT only appends to that table, so the slots below stay valid.
 */
class OrtApi(libraryPath: String, apiVersion: Int = 22) {
    private object Slot {
        const val GET_ERROR_MESSAGE = 2
        const val CREATE_ENV = 3
        const val CREATE_SESSION = 7
        const val RUN = 9
        const val CREATE_SESSION_OPTIONS = 10
        const val SET_EXECUTION_MODE = 13
        const val SET_GRAPH_OPTIMIZATION_LEVEL = 23
        const val SET_INTRA_OP_THREADS = 24
        const val SET_INTER_OP_THREADS = 25
        const val CREATE_TENSOR_WITH_DATA = 49
        const val GET_TENSOR_MUTABLE_DATA = 51
        const val GET_DIMENSIONS_COUNT = 61
        const val GET_DIMENSIONS = 62
        const val GET_TENSOR_TYPE_AND_SHAPE = 65
        const val CREATE_CPU_MEMORY_INFO = 69
        const val RELEASE_STATUS = 93
        const val RELEASE_VALUE = 96
        const val RELEASE_TENSOR_TYPE_AND_SHAPE_INFO = 99
    }

    private val api: Pointer

    init {
        val base = pin(libraryPath).getFunction("OrtGetApiBase").invokePointer(arrayOf())
        // OrtApiBase = { GetApi(version), GetVersionString() }; GetApi returns null for a version the library lacks
        api = JnaFunction.getFunction(base.getPointer(0)).invokePointer(arrayOf<Any?>(apiVersion))
            ?: error("$libraryPath does not provide ORT C API version $apiVersion; use onnxruntime >= 1.$apiVersion")
    }

    private companion object {
        /**
         * JNA (5.12+) holds a NativeLibrary weakly and dlcloses it once collected. Before ORT has registered a
         * thread-local destructor (CreateEnv does) that unmaps libonnxruntime, and every function pointer read from
         * the api table dangles: a SIGSEGV in libffi in CI, reproduced by a GC between OrtApi() and createEnv().
         * ORT cannot be unloaded and reloaded in one process anyway (its env is a process singleton): pin it.
         */
        private val pinned = HashMap<String, NativeLibrary>()

        @Synchronized
        fun pin(libraryPath: String): NativeLibrary = pinned.getOrPut(libraryPath) { NativeLibrary.getInstance(libraryPath) }
    }

    private fun fn(slot: Int) = JnaFunction.getFunction(api.getPointer(slot.toLong() * Native.POINTER_SIZE))

    /** Calls a status-returning API function; a non-null OrtStatus becomes an exception with ORT's message. */
    private fun call(slot: Int, vararg args: Any?) {
        val status = fn(slot).invokePointer(args) ?: return
        val message = fn(Slot.GET_ERROR_MESSAGE).invokeString(arrayOf<Any?>(status), false)
        fn(Slot.RELEASE_STATUS).invokeVoid(arrayOf<Any?>(status))
        throw IllegalStateException("onnxruntime: $message")
    }

    private fun out(slot: Int, vararg args: Any?): Pointer {
        val ref = PointerByReference()
        call(slot, *args, ref)
        return ref.value.also { Reference.reachabilityFence(ref) } // JNA's cleaner must not free it mid-read
    }

    fun createEnv(): Pointer = out(Slot.CREATE_ENV, 3 /* ORT_LOGGING_LEVEL_ERROR */, "mtpkit")

    /** Same options as runtime/backends/onnx.py: sequential, one inter-op thread, full graph optimisation. */
    fun createSessionOptions(threads: Int): Pointer {
        val options = out(Slot.CREATE_SESSION_OPTIONS)
        call(Slot.SET_INTRA_OP_THREADS, options, threads)
        call(Slot.SET_INTER_OP_THREADS, options, 1)
        call(Slot.SET_EXECUTION_MODE, options, 0 /* ORT_SEQUENTIAL */)
        call(Slot.SET_GRAPH_OPTIMIZATION_LEVEL, options, 99 /* ORT_ENABLE_ALL */)
        return options
    }

    fun createSession(env: Pointer, path: String, options: Pointer): Pointer = out(Slot.CREATE_SESSION, env, path, options)

    fun createCpuMemoryInfo(): Pointer = out(Slot.CREATE_CPU_MEMORY_INFO, 0 /* OrtDeviceAllocator */, 0 /* default */)

    /** Wraps host memory as a tensor; [data] must stay reachable until the value is released. */
    fun createTensor(memoryInfo: Pointer, data: Memory, bytes: Long, shape: LongArray, elementType: Int): Pointer {
        val dims = Memory(maxOf(1, shape.size) * 8L).also { m -> shape.forEachIndexed { i, d -> m.setLong(i * 8L, d) } }
        try {
            return out(Slot.CREATE_TENSOR_WITH_DATA, memoryInfo, data, bytes, dims, shape.size.toLong(), elementType)
        } finally {
            dims.close() // ORT copies the shape
        }
    }

    fun run(session: Pointer, inputNames: Array<String>, inputs: Array<Pointer>, outputNames: Array<String>): Array<Pointer> {
        val outputs = Memory(outputNames.size * Native.POINTER_SIZE.toLong()).also { it.clear() }
        try {
            call(Slot.RUN, session, null, inputNames, inputs, inputs.size.toLong(), outputNames, outputNames.size.toLong(), outputs)
            return Array(outputNames.size) { outputs.getPointer(it.toLong() * Native.POINTER_SIZE) }
        } finally {
            outputs.close()
        }
    }

    fun shape(value: Pointer): LongArray {
        val info = out(Slot.GET_TENSOR_TYPE_AND_SHAPE, value)
        try {
            val count = LongByReference().also { call(Slot.GET_DIMENSIONS_COUNT, info, it) }.value.toInt()
            Memory(maxOf(1, count) * 8L).use { dims ->
                call(Slot.GET_DIMENSIONS, info, dims, count.toLong())
                return LongArray(count) { dims.getLong(it * 8L) }
            }
        } finally {
            fn(Slot.RELEASE_TENSOR_TYPE_AND_SHAPE_INFO).invokeVoid(arrayOf<Any?>(info))
        }
    }

    fun data(value: Pointer): Pointer = out(Slot.GET_TENSOR_MUTABLE_DATA, value)

    fun releaseValue(value: Pointer) = fn(Slot.RELEASE_VALUE).invokeVoid(arrayOf<Any?>(value))
}
