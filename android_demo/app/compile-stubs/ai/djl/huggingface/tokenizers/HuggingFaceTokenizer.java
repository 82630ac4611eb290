// Compile-only declaration (android_demo/test.sh's classpath, never packaged). Mirrors deepjavalibrary/djl v0.30.0
// extensions/tokenizers/src/main/java/ai/djl/huggingface/tokenizers/HuggingFaceTokenizer.java: the members the app
// calls. Upstream extends NativeResource<Long> and implements Tokenizer; of those the app relies only on
// AutoCloseable.
package ai.djl.huggingface.tokenizers;

import java.io.IOException;
import java.io.InputStream;
import java.util.Map;

public final class HuggingFaceTokenizer implements AutoCloseable {
    private HuggingFaceTokenizer() {}

    public static HuggingFaceTokenizer newInstance(InputStream is, Map<String, String> options)
            throws IOException {
        throw new UnsupportedOperationException("compile-only declaration");
    }

    public Encoding encode(String text, boolean addSpecialTokens, boolean withOverflowingTokens) {
        throw new UnsupportedOperationException("compile-only declaration");
    }

    public String decode(long[] ids, boolean skipSpecialTokens) {
        throw new UnsupportedOperationException("compile-only declaration");
    }

    @Override
    public void close() {
        throw new UnsupportedOperationException("compile-only declaration");
    }
}
